"""``weight_sync``: actor -> rollout weight sync with 1, 2 and 4 receivers, against a memcpy.

Real worker groups on Ray: one sender (the actor's rank 0) on device 0 and up to four receivers
(rollout processes) on the next devices. Each holds the same named float32 tensors (16 tensors,
64 MB in all; 8 MB in quick mode). Two paths of :mod:`rltrain.backends.weight_sync` are timed
per receiver count:

- **collective**: :func:`~rltrain.backends.weight_sync.collective.broadcast_weights` over a
  standalone :class:`~rltrain.backends.weight_sync.collective.SyncGroup` (gloo on CPU and
  simulated devices, NCCL when every process has a GPU): layout, pack, broadcast, load;
- **object store**: the sender packs into CPU buckets
  (:func:`~rltrain.backends.weight_sync.host.pack_to_host`), the receivers get them through
  Ray's object store and load them (:func:`~rltrain.backends.weight_sync.host.load_from_host`).

The baseline is a plain ``copy_`` of the same number of bytes inside the sender process, timed
the same way (one group call), so both sides pay one driver round trip. A raw broadcast of one
flat tensor of the same bytes over the same group shows what the transport alone costs, so the
gap to ``broadcast_weights`` is the sync's own work (layout, pack, load). Throughput is weight
bytes per second of sync (each receiver gets all of them). Before timing, one sync of each kind is
checked: every receiver must end with the sender's tensors.

Cluster: the local Ray with simulated devices (started here and stopped afterwards, unless a
Ray is already running in this process), or an existing cluster when ``RLTRAIN_BENCH_ADDRESS``
is set (``auto`` or ``host:port``). With fewer free devices than receivers, simulated devices are
shared by several receivers (gloo does not care); real GPUs are not, and the receiver counts that
do not fit are left out (the note says so).
"""

from __future__ import annotations

import os
from typing import Any

from rltrain.bench.harness import Case, Suite, measure
from rltrain.scheduler.worker import Worker  # import-light: no Ray, no torch

RECEIVERS = (1, 2, 4)
QUICK_RECEIVERS = (1, 2)
NBYTES, QUICK_NBYTES = 64 * 10**6, 8 * 10**6
NUM_TENSORS = 16
#: Environment variable naming an existing Ray cluster to measure (``auto`` or ``host:port``).
ADDRESS_ENV = "RLTRAIN_BENCH_ADDRESS"


class SyncBenchWorker(Worker):
    """Holds named weights; sends them (rank 0 of the actor group) or receives them."""

    def __init__(self, nbytes: int, num_tensors: int, seed: int) -> None:
        import torch

        on_gpu = torch.cuda.is_available() and bool(self.devices)
        self.device = torch.device("cuda", self.devices[0]) if on_gpu else torch.device("cpu")
        numel = nbytes // 4 // num_tensors
        gen = torch.Generator().manual_seed(seed)
        self.params = {
            f"layers.{i}.weight": torch.randn(numel, generator=gen).to(self.device)
            for i in range(num_tensors)
        }
        total = numel * num_tensors * 4
        # Filled, not just allocated: copying untouched pages measures the zero page, not memory.
        self.flat = torch.empty(total, dtype=torch.uint8, device=self.device).random_(0, 255)
        self.flat_dst = torch.zeros_like(self.flat)
        self.syncs: dict[str, Any] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def memcpy(self) -> None:
        """The baseline: one copy of the weights' byte count on this process's device."""
        self.flat_dst.copy_(self.flat)
        self._sync()

    def free_port(self) -> tuple[str, int]:
        import ray

        from rltrain.scheduler.worker import free_port

        return ray.util.get_node_ip_address(), free_port()

    def join_sync(self, name: str, backend: str, host: str, port: int, world: int, rank: int):
        from rltrain.backends.weight_sync.collective import SyncGroup

        self.syncs[name] = SyncGroup(backend, host, port, world, rank, timeout_s=120.0)

    def raw_broadcast(self, name: str) -> None:
        """The transport alone: one flat tensor of the same bytes, no layout, pack or load."""
        self.syncs[name].broadcast(self.flat, 0)
        self._sync()

    def send(self, name: str) -> int:
        from rltrain.backends.weight_sync.collective import broadcast_weights

        sent = broadcast_weights(self.syncs[name], 0, named=list(self.params.items()))
        self._sync()
        return sent

    def receive(self, name: str) -> int:
        from rltrain.backends.weight_sync.collective import broadcast_weights

        written = broadcast_weights(self.syncs[name], 0, params=self.params)
        self._sync()
        return written

    def pack(self) -> Any:
        from rltrain.backends.weight_sync.host import pack_to_host

        return pack_to_host(list(self.params.items()))

    def load(self, packed: Any) -> int:
        from rltrain.backends.weight_sync.host import load_from_host

        return load_from_host(packed, self.params)

    def scramble(self) -> None:
        """Overwrite the weights so the next check proves a sync really happened."""
        for t in self.params.values():
            t.fill_(-1.0)

    def checksum(self) -> list[float]:
        return [float(t.double().sum()) for t in self.params.values()]


# ------------------------------------------------------------------------------------- setup
def _cluster(receivers: int) -> Any:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from rltrain.scheduler import Cluster

    address = os.environ.get(ADDRESS_ENV)
    if address:
        return Cluster.start({"address": address, "startup_timeout_s": 300})
    return Cluster.start(
        {"devices_per_node": receivers + 1, "device_memory_gib": 2.0, "startup_timeout_s": 300}
    )


def _receiver_devices(spec: Any, wanted: int) -> tuple[list[list[int]], str]:
    """Hardware ranks per receiver (the sender has rank 0), and a note on how they were placed."""
    total = spec.num_devices
    simulated = all(n.accelerator_type == "sim" for n in spec.nodes if n.num_devices)
    if total >= wanted + 1:
        return [[1 + i] for i in range(wanted)], "each process on its own device"
    if simulated and total >= 1:
        free = list(range(1, total)) or [0]
        ranks = [[free[i % len(free)]] for i in range(wanted)]
        return ranks, f"{wanted} receivers share {len(free)} simulated device(s) (gloo)"
    fit = max(total - 1, 0)
    return [[1 + i] for i in range(fit)], f"only {total} device(s): {fit} receivers fit"


def _join(name: str, sender: Any, receivers: Any) -> None:
    """Make the standalone sync group ``name`` over the sender and a view of the receivers."""
    backend = sender.backend().wait(timeout=60)[0]
    host, port = sender.free_port().wait(timeout=60)[0]
    world = 1 + len(receivers.ranks)
    pending = [sender.join_sync(name, backend, host, port, world, 0)]
    pending.append(
        receivers.call_each(
            SyncBenchWorker.join_sync,
            [(name, backend, host, port, world, 1 + i) for i in range(len(receivers.ranks))],
        )
    )
    for f in pending:
        f.wait(timeout=180)


def _check(sender: Any, receivers: Any, run_sync: Any, what: str) -> None:
    receivers.scramble().wait(timeout=60)
    run_sync()
    want = sender.checksum().wait(timeout=60)[0]
    got = receivers.checksum().wait(timeout=60)
    if any(g != want for g in got):
        raise RuntimeError(
            f"weight_sync bench: after a {what} sync a receiver differs from the sender"
        )


@measure("weight_sync", "weight sync actor -> 1/2/4 rollout receivers (gloo/NCCL, object store)")
def weight_sync(quick: bool) -> Suite:
    from rltrain.placement.strategies import FlexiblePlacementStrategy, PackedPlacementStrategy

    counts = QUICK_RECEIVERS if quick else RECEIVERS
    nbytes = QUICK_NBYTES if quick else NBYTES
    cluster = _cluster(max(counts))
    placed, how = _receiver_devices(cluster.spec, max(counts))
    counts = tuple(k for k in counts if k <= len(placed))
    groups: list[Any] = []

    def teardown() -> None:
        for g in groups:
            g.shutdown()
        cluster.shutdown()  # stops Ray only if this measure started it

    try:
        sender = SyncBenchWorker.create_group(nbytes, NUM_TENSORS, 0).launch(
            cluster, name="bench_sync_actor", placement_strategy=PackedPlacementStrategy(0, 0)
        )
        groups.append(sender)
        rollout = SyncBenchWorker.create_group(nbytes, NUM_TENSORS, 1).launch(
            cluster, name="bench_sync_rollout", placement_strategy=FlexiblePlacementStrategy(placed)
        )
        groups.append(rollout)
        cases = [Case("memcpy in sender", lambda: sender.memcpy().wait(timeout=120))]
        for k in counts:
            cases += _cases(sender, rollout.execute_on(*range(k)), k, nbytes)
    except BaseException:
        teardown()
        raise
    backend = sender.backend().wait(timeout=60)[0]
    mb = nbytes / 1e6
    cases = [Case(c.name, c.fn, work=mb, work_unit="MB") for c in cases]
    return Suite(
        cases=tuple(cases),
        baseline="memcpy in sender",
        warmup=1,
        repeats=5,
        note=(
            f"{mb:g} MB of float32 weights in {NUM_TENSORS} tensors; collective = {backend}; "
            f"{how}; throughput = weight bytes synced per second (each receiver gets all)."
        ),
        teardown=teardown,
    )


def _cases(sender: Any, view: Any, k: int, nbytes: int) -> list[Case]:
    name = f"bench_sync_{k}"
    _join(name, sender, view)

    def collective() -> None:
        pending = [sender.send(name), view.receive(name)]
        for f in pending:
            f.wait(timeout=300)

    def raw() -> None:
        pending = [sender.raw_broadcast(name), view.raw_broadcast(name)]
        for f in pending:
            f.wait(timeout=300)

    def object_store() -> None:
        packed = sender.pack().refs[0]
        view.call(SyncBenchWorker.load, packed).wait(timeout=300)

    _check(sender, view, collective, "collective")
    _check(sender, view, object_store, "object store")
    backend = sender.backend().wait(timeout=60)[0]
    return [
        Case(f"raw {backend} broadcast of the bytes, {k} receiver{'s' * (k > 1)}", raw),
        Case(f"{backend} broadcast_weights, {k} receiver{'s' * (k > 1)}", collective),
        Case(f"object store, {k} receiver{'s' * (k > 1)}", object_store),
    ]
