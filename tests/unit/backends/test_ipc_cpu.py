"""What of the CUDA-IPC path can be checked without a GPU: payload selection and refusals, and
the life of the actor's buckets: held until every receiver acknowledged its load, then freed (or
reused, for a version no receiver opened), declared in the actor's ledger meanwhile."""

from __future__ import annotations

import weakref

import pytest
import torch

from rltrain.backends.weight_sync.ipc import (
    HeldVersions,
    IpcPayload,
    IpcSender,
    receive_ipc,
    select_payload,
)
from rltrain.backends.weight_sync.transport import CollectiveVersion, acknowledge_ipc
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, PlacementError, WorkerError
from rltrain.placement.sizes import derive_sizes
from rltrain.placement.transport_choice import TransportChoice
from rltrain.workers.actor import ActorWorker


def _payload(rank: int) -> IpcPayload:
    return IpcPayload(sender_rank=rank, device_uuid=f"GPU-{rank}", version=3, buckets=())


def test_select_payload_follows_the_rank_map() -> None:
    payloads = {0: _payload(0), 1: _payload(1)}
    assert select_payload(payloads, {0: 1, 1: 0}, rollout_rank=0).sender_rank == 1
    with pytest.raises(PlacementError, match="not in the IPC rank map"):
        select_payload(payloads, {0: 1}, rollout_rank=5)
    with pytest.raises(PlacementError, match="actor rank 7, which published no"):
        select_payload(payloads, {0: 7}, rollout_rank=0)


def test_ipc_refuses_cpu_tensors_and_missing_targets() -> None:
    with pytest.raises(ConfigError, match="one CUDA device"):
        IpcSender().publish([("w", torch.zeros(3))], version=0)
    with pytest.raises(ConfigError, match="needs params"):
        receive_ipc(_payload(0))


# ---------------------------------------------- the buckets live until every receiver loaded
def _bufs(n: int = 1000) -> list[torch.Tensor]:
    return [torch.zeros(n, dtype=torch.uint8), torch.zeros(n // 2, dtype=torch.uint8)]


def test_a_version_is_freed_once_every_receiver_loaded_it() -> None:
    held = HeldVersions(receivers=(0, 1))
    bufs = _bufs()
    gone = weakref.ref(bufs[0])
    held.hold(0, bufs)
    del bufs
    assert held.nbytes == 1500
    assert held.acknowledge(0, 0) == 0 and held.nbytes == 1500  # rank 1 may still read it
    assert held.acknowledge(1, 0) == 1500 and held.nbytes == 0
    assert gone() is None  # really released, not kept for reuse
    with pytest.raises(WorkerError, match="receiver rank 5 acknowledged version 1"):
        held.acknowledge(5, 1)


def test_a_skipped_version_becomes_the_next_versions_buffers() -> None:
    # an asynchronous run hands the newest version only: version 1 is never opened, so torch
    # would keep it alive if it were freed (its handle still counts); it is reused instead
    held = HeldVersions(receivers=(0,))
    one, two = _bufs(), _bufs()
    held.hold(1, one)
    held.hold(2, two)
    assert held.acknowledge(0, 2) == 1500  # version 2, opened, is freed
    assert held.nbytes == 1500  # version 1 waits as a spare
    assert held.get(3) is one and held.get(4) is None  # packed into by the next publish
    held.hold(3, one)
    assert held.get(3) is one  # republishing a held version repacks its own buffers
    assert held.clear() == 1500 and held.nbytes == 0


class _Owner:
    """An actor handle's ``release_weights.remote`` as a receiver calls it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.release_weights = self

    def remote(self, receiver: str, version: int, rank: int) -> tuple[str, int, int]:
        self.calls.append((receiver, version, rank))
        return (receiver, version, rank)


def test_a_receiver_acknowledges_each_payload_it_loaded_and_waits() -> None:
    owners = {0: _Owner(), 1: _Owner(), 2: _Owner()}
    payloads = {
        a: IpcPayload(a, f"GPU-{a}", 7, (), owner=o, receiver="inference")
        for a, o in owners.items()
    }
    waited: list[list] = []
    assert acknowledge_ipc(payloads, (0, 2), 3, 5.0, wait=waited.append) == 2
    assert owners[0].calls == owners[2].calls == [("inference", 7, 3)] and not owners[1].calls
    assert waited == [[("inference", 7, 3)] * 2]
    # other transports, and payloads made outside Ray (no owner), need nothing
    assert acknowledge_ipc(CollectiveVersion(7), (0,), 3, 5.0, wait=waited.append) == 0
    assert acknowledge_ipc({0: _payload(0)}, (0,), 3, 5.0, wait=waited.append) == 0

    def too_slow(refs: list) -> None:
        raise TimeoutError

    with pytest.raises(WorkerError, match=r"actor ranks \[0\] did not free their IPC buckets"):
        acknowledge_ipc(payloads, (0,), 3, 5.0, wait=too_slow)


def test_the_actor_ledger_declares_held_buckets_until_they_are_loaded() -> None:
    # simulated devices count every CPU tensor a worker holds as device memory: buckets held
    # for a receiver must be declared (as weight_sync), or the ledger check fails
    run = RunConfig()
    run.model.num_layers = 1
    actor = ActorWorker(run, derive_sizes(run, 1, 1))
    choice = TransportChoice("ipc", "test", feeders=((0, (0,)),))
    actor.setup_weight_sync({"rollout": choice})
    sender = actor._senders["rollout"]
    sender._ipc = IpcSender(0, receivers=choice.receivers_of(0))
    sender._ipc.held.hold(4, _bufs(1_000_000))  # what publish packs on a GPU
    report = actor.memory_report()
    assert report["transient"] == {"weight_sync": 1_500_000}
    assert actor.state_bytes().keys() == {"weights", "grads", "optimizer"}  # not resident state
    assert actor.release_weights("rollout", 4, 0) == 1_500_000
    assert actor.memory_report()["transient"] == {"weight_sync": 0}


def test_a_sender_outside_ray_never_imports_it() -> None:
    # the GPU checks run the IPC export where Ray may not be installed: it is only looked up
    import subprocess
    import sys

    code = (
        "import sys; from rltrain.backends.weight_sync.transport import _own_handle; "
        "assert _own_handle() is None and 'ray' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_receiver_in_the_senders_own_process_reads_the_buffer_itself():
    """CUDA cannot open an IPC handle in the process that made it ("invalid device context",
    the 2026-11-26 H200 lease): the sender's own process gets its buffer, the weak registry
    lets a freed version go, and another process opens the handle."""
    import gc
    import os

    from rltrain.backends.weight_sync import ipc

    buf = torch.arange(4.0)
    ipc._OWN_BUFFERS[(0, "rollout", 9, 0)] = buf
    mine = IpcPayload(0, "GPU-0", 9, (), None, "rollout", os.getpid())
    assert mine.own_buffer(0) is buf
    other = IpcPayload(0, "GPU-0", 9, (), None, "rollout", os.getpid() + 1)
    assert other.own_buffer(0) is None
    del buf
    gc.collect()
    with pytest.raises(WorkerError, match="version 9 of actor rank 0 was freed"):
        mine.own_buffer(0)
