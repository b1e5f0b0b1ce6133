"""The collective transport on CPU: snapshots broadcast in version order from a background
thread, receivers take every version up to the one they were handed (gloo, two ranks in one
process, one thread each)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from rltrain.backends.weight_sync.buckets import load_bucket
from rltrain.backends.weight_sync.collective import SyncGroup
from rltrain.backends.weight_sync.host import HostBuckets
from rltrain.backends.weight_sync.transport import (
    CollectiveSender,
    CollectiveVersion,
    WeightSender,
    payload_for,
    receive_versions,
    weight_version,
)
from rltrain.errors import WorkerError
from rltrain.placement.transport_choice import TransportChoice
from rltrain.scheduler.worker import free_port


def _named(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(7, 5, generator=gen),
        "b.bias": torch.randn(3, generator=gen).to(torch.bfloat16),
    }


def test_versions_arrive_in_order_bit_identical_while_the_sender_moves_on():
    choice = TransportChoice("collective", "test", backend="gloo", feeders=((0, (0,)),))
    port = free_port()
    sender = WeightSender(choice, rank=0, bucket_bytes=256)  # several buckets
    receiver: dict[str, SyncGroup] = {}

    def join_receiver() -> None:
        receiver["g"] = SyncGroup("gloo", "127.0.0.1", port, 2, 1, timeout_s=60)

    t = threading.Thread(target=join_receiver)
    t.start()
    sender.join("127.0.0.1", port, 2, timeout_s=60)
    t.join()

    weights = _named(0)
    snapshots = []
    for version in (1, 2):
        handed = sender.export(list(weights.items()), version)
        assert handed == CollectiveVersion(version)
        snapshots.append({k: v.clone() for k, v in weights.items()})
        for v in weights.values():  # training goes on: the snapshot must not see it
            v.add_(1)

    mine = {k: torch.zeros_like(v) for k, v in weights.items()}
    seen: list[dict[str, torch.Tensor]] = []

    def loader(bucket, flat):
        written = load_bucket(bucket, flat, mine)
        return written

    # Take version 1 alone, then version 2.
    assert receive_versions(receiver["g"], loader, -1, 1) == 1
    seen.append({k: v.clone() for k, v in mine.items()})
    assert receive_versions(receiver["g"], loader, 1, 2) == 2
    seen.append({k: v.clone() for k, v in mine.items()})
    sender.flush(timeout=60)
    for got, want in zip(seen, snapshots, strict=True):
        for k in want:
            assert torch.equal(got[k], want[k]), k
    # A receiver already at the target takes nothing (and does not block).
    assert receive_versions(receiver["g"], loader, 2, 2) == 2


def test_handed_weights_and_their_versions():
    host = HostBuckets(4, (), ())
    assert weight_version(host) == 4 and payload_for(host, (0,)) is host
    assert weight_version(CollectiveVersion(9)) == 9

    class P:
        def __init__(self, version):
            self.version = version

    payloads = {0: P(3), 1: P(3)}
    assert weight_version(payloads) == 3
    assert [p.version for p in payload_for(payloads, (1, 0))] == [3, 3]


def test_a_missing_ipc_payload_names_the_actor_rank():
    with pytest.raises(WorkerError, match=r"actor ranks \[2\]"):
        payload_for({0: object(), 1: object()}, (2,))


def _joined(timeout_s: float) -> tuple[WeightSender, SyncGroup]:
    """A collective sender and its one receiver's group (two ranks, one thread each)."""
    choice = TransportChoice("collective", "test", backend="gloo", feeders=((0, (0,)),))
    port = free_port()
    sender = WeightSender(choice, rank=0, bucket_bytes=256)
    receiver: dict[str, SyncGroup] = {}

    def join_receiver() -> None:
        receiver["g"] = SyncGroup("gloo", "127.0.0.1", port, 2, 1, timeout_s=timeout_s)

    t = threading.Thread(target=join_receiver)
    t.start()
    sender.join("127.0.0.1", port, 2, timeout_s=timeout_s)
    t.join()
    return sender, receiver["g"]


def test_a_receiver_that_takes_its_version_after_the_collective_timeout_gets_it():
    # An async run's rollout takes a version some generations after its export (up to
    # trainer.max_staleness of them): a wait longer than cluster.collective_timeout_s must not
    # fail the broadcast, which starts only when the receiver asks for the version.
    timeout_s = 1.0
    sender, group = _joined(timeout_s)
    # 4 MiB: more than the sockets buffer, so a send blocks until the receiver reads it.
    weights = {**_named(0), "c.weight": torch.randn(1024, 1024)}
    sent = []
    for version in (1, 2):
        sender.export(list(weights.items()), version)
        sent.append({k: v.clone() for k, v in weights.items()})
        for v in weights.values():
            v.add_(1)
    time.sleep(3 * timeout_s)  # the rollout is generating: the scenario itself, not a wait
    sender.export(list(weights.items()), 3)  # reaps the earlier broadcasts: none failed

    mine = {k: torch.zeros_like(v) for k, v in weights.items()}
    assert receive_versions(group, lambda b, f: load_bucket(b, f, mine), -1, 2) == 2
    for k in mine:
        assert torch.equal(mine[k], sent[1][k]), k
    assert receive_versions(group, lambda b, f: load_bucket(b, f, mine), 2, 3) == 3
    sender.flush(timeout=30)
    for k in mine:
        assert torch.equal(mine[k], weights[k]), k
    sender.close()


class _GatedGroup:
    """A sync group's sender side with an accelerator device (``meta``: no memory, no GPU):
    receivers want versions when the test says so, and each broadcast records where its
    tensor is and what the sender declares on the device at that moment."""

    def __init__(self) -> None:
        self.rank, self.world_size = 0, 2
        self.device = torch.device("meta")
        self.sender: Any = None
        self.broadcasts: list[tuple[str, int]] = []
        self._wanted = -1
        self._cond = threading.Condition()

    def want(self, version: int) -> None:
        with self._cond:
            self._wanted = version
            self._cond.notify_all()

    def wanted(self) -> int:
        return self._wanted

    def wait_wanted(self, above: int, stop: threading.Event | None = None) -> bool:
        with self._cond:
            while self._wanted <= above:
                if stop is not None and stop.is_set():
                    return False
                self._cond.wait(0.05)
        return True

    def broadcast_object(self, obj: object, src: int) -> object:
        return obj

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.broadcasts.append((tensor.device.type, self.sender.device_bytes))


def test_one_snapshot_on_the_device_later_versions_wait_on_the_host():
    group = _GatedGroup()
    sender = CollectiveSender(group, bucket_bytes=64)  # type: ignore[arg-type]
    group.sender = sender
    # Two float32 tensors of 16 elements: 64 B each, one 64-B bucket each, 128 B a snapshot.
    weights = [("a", torch.ones(16)), ("b", torch.ones(16))]
    for version in (1, 2, 3):
        sender.send(weights, version)
    # The first pending version is on the device; the two exported behind it on the host.
    assert [(v, d.type) for v, d in sender.held] == [(1, "meta"), (2, "cpu"), (3, "cpu")]
    assert sender.device_bytes == 128
    group.want(3)
    sender.flush(timeout=30)
    # Version 1 from its device snapshot (128 B declared); 2 and 3 one host bucket at a time,
    # each moved to the device for its broadcast (64 B declared).
    assert group.broadcasts == [("meta", 128)] * 2 + [("meta", 64)] * 4
    assert sender.device_bytes == 0 and sender.held == []
    # With nothing pending, the next export goes to the device again.
    sender.send(weights, 4)
    assert [(v, d.type) for v, d in sender.held] == [(4, "meta")]
    assert sender.device_bytes == 128
    sender.close()
    with pytest.raises(WorkerError, match="version 4 was not broadcast"):
        sender.flush(timeout=30)
    assert sender.device_bytes == 0


def test_the_sender_declares_its_collective_snapshot_in_the_ledger():
    choice = TransportChoice("collective", "test", backend="gloo", feeders=((0, (0,)),))
    sender = WeightSender(choice, rank=0, bucket_bytes=64)
    group = _GatedGroup()
    sender._collective = CollectiveSender(group, bucket_bytes=64)  # type: ignore[arg-type]
    group.sender = sender._collective
    sender.export([("a", torch.ones(16)), ("b", torch.ones(16))], 1)
    assert sender.device_bytes == 128  # the actor's weight_sync kind
    sender.close()


def test_a_receiver_whose_peer_never_asks_fails_after_the_timeout_naming_the_key():
    # Two receivers of one group start the same call; one never announces (Ray cancelled its
    # call before it began): the other fails after cluster.collective_timeout_s, not never.
    port = free_port()
    groups: dict[int, SyncGroup] = {}

    def join(rank: int) -> None:
        groups[rank] = SyncGroup("gloo", "127.0.0.1", port, 3, rank, timeout_s=1.0)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    began = time.monotonic()
    with pytest.raises(WorkerError, match=r"did not ask for version 1 within 1.0 s "
                                          r"\(cluster.collective_timeout_s\)"):  # fmt: skip
        receive_versions(groups[1], lambda bucket, flat: 0, 0, 1)
    assert time.monotonic() - began < 30
