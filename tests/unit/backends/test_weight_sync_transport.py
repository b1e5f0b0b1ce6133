"""The collective transport on CPU: snapshots broadcast in version order from a background
thread, receivers take every version up to the one they were handed (gloo, two ranks in one
process, one thread each)."""

from __future__ import annotations

import threading

import torch

from rltrain.backends.weight_sync.buckets import load_bucket
from rltrain.backends.weight_sync.collective import SyncGroup
from rltrain.backends.weight_sync.host import HostBuckets
from rltrain.backends.weight_sync.transport import (
    CollectiveVersion,
    WeightSender,
    payload_for,
    receive_versions,
    weight_version,
)
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
    import pytest

    from rltrain.errors import WorkerError

    with pytest.raises(WorkerError, match=r"actor ranks \[2\]"):
        payload_for({0: object(), 1: object()}, (2,))
