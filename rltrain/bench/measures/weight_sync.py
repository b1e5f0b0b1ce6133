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
    backend = sender.call(SyncBenchWorker.backend).wait(timeout=60)[0]
    host, port = sender.call(SyncBenchWorker.free_port).wait(timeout=60)[0]
    world = 1 + len(receivers.ranks)
    pending = [sender.call(SyncBenchWorker.join_sync, name, backend, host, port, world, 0)]
    pending.append(
        receivers.call_each(
            SyncBenchWorker.join_sync,
            [(name, backend, host, port, world, 1 + i) for i in range(len(receivers.ranks))],
        )
    )
    for f in pending:
        f.wait(timeout=180)


def _check(sender: Any, receivers: Any, run_sync: Any, what: str) -> None:
    receivers.call(SyncBenchWorker.scramble).wait(timeout=60)
    run_sync()
    want = sender.call(SyncBenchWorker.checksum).wait(timeout=60)[0]
    got = receivers.call(SyncBenchWorker.checksum).wait(timeout=60)
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
        cases = [
            Case("memcpy in sender", lambda: sender.call(SyncBenchWorker.memcpy).wait(timeout=120))
        ]
        for k in counts:
            cases += _cases(sender, rollout.execute_on(*range(k)), k, nbytes)
    except BaseException:
        teardown()
        raise
    backend = sender.call(SyncBenchWorker.backend).wait(timeout=60)[0]
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
        pending = [
            sender.call(SyncBenchWorker.send, name),
            view.call(SyncBenchWorker.receive, name),
        ]
        for f in pending:
            f.wait(timeout=300)

    def raw() -> None:
        pending = [
            sender.call(SyncBenchWorker.raw_broadcast, name),
            view.call(SyncBenchWorker.raw_broadcast, name),
        ]
        for f in pending:
            f.wait(timeout=300)

    def object_store() -> None:
        packed = sender.call(SyncBenchWorker.pack).refs[0]
        view.call(SyncBenchWorker.load, packed).wait(timeout=300)

    _check(sender, view, collective, "collective")
    _check(sender, view, object_store, "object store")
    backend = sender.call(SyncBenchWorker.backend).wait(timeout=60)[0]
    return [
        Case(f"raw {backend} broadcast of the bytes, {k} receiver{'s' * (k > 1)}", raw),
        Case(f"{backend} broadcast_weights, {k} receiver{'s' * (k > 1)}", collective),
        Case(f"object store, {k} receiver{'s' * (k > 1)}", object_store),
    ]


# ------------------------------------------------------------------ per step, with real models
#: ``model.*`` of the ~50M-parameter policy: 12 layers of hidden 512 / MLP 2048 (47.2M params,
#: 188.9 MB in float32) over the built-in tokenizer.
MODEL_50M = {"hidden_size": 512, "intermediate_size": 2048, "num_layers": 12, "num_heads": 8}


class ModelSyncWorker(Worker):
    """Holds a policy model and moves it as the trainer does: the actor's end of a transport
    (``sender``) or a receiver's (:class:`~rltrain.backends.generation.TorchReceiver`)."""

    def __init__(self, model: dict[str, Any], sender: bool) -> None:
        import torch

        from rltrain.backends.generation import TorchReceiver
        from rltrain.backends.weight_sync.transport import WeightSender
        from rltrain.config.schema import ModelConfig, RunConfig
        from rltrain.placement.transport_choice import TransportChoice

        run = RunConfig()
        run.model = ModelConfig(**model, init_seed=0 if sender else 1)
        self.engine = TorchReceiver(run, torch.device("cpu"))
        self.version = 0
        one = ((0, (0,)),)
        self.host = WeightSender(TransportChoice("host", "bench", feeders=one), 0)
        self.coll = WeightSender(TransportChoice("collective", "bench", None, "gloo", one), 0)
        flat = sum(p.numel() * p.element_size() for p in self.engine.model.parameters())
        self.flat = torch.empty(flat, dtype=torch.uint8).random_(0, 255)
        self.flat_dst = torch.zeros_like(self.flat)
        self.is_sender = sender

    def nbytes(self) -> int:
        return int(self.flat.numel())

    def free_port(self) -> tuple[str, int]:
        import ray

        from rltrain.scheduler.worker import free_port

        return ray.util.get_node_ip_address(), free_port()

    def join(self, host: str, port: int) -> None:
        if self.is_sender:
            self.coll.join(host, port, 2, 120.0)
        else:
            self.engine.join_sync("gloo", host, port, 2, 1, 120.0)

    def memcpy(self) -> None:
        """The baseline: one copy of the weights' byte count in this process."""
        self.flat_dst.copy_(self.flat)

    def export_host(self) -> Any:
        self.version += 1
        return self.host.export(list(self.engine.model.named_parameters()), self.version)

    def load_host(self, packed: Any) -> int:
        return self.engine.load(packed)

    def send_collective(self, version: int) -> int:
        self.coll.export(list(self.engine.model.named_parameters()), version)
        self.coll.flush(120.0)
        return version

    def receive_collective(self, target: int) -> int:
        self.version = self.engine.receive(self.version, target)
        return self.version

    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.engine.model.parameters()))


def _step_cases(
    cluster: Any, groups: list[Any], model: dict[str, Any], label: str, first: int
) -> list[Case]:
    """Host vs collective weight sync of one model, actor on device ``first``, rollout on the
    next device."""
    from rltrain.placement.strategies import PackedPlacementStrategy

    tag = label.split()[0]
    actor = ModelSyncWorker.create_group(model, True).launch(
        cluster,
        name=f"bench_step_actor_{tag}",
        placement_strategy=PackedPlacementStrategy(first, first),
    )
    groups.append(actor)
    rollout = ModelSyncWorker.create_group(model, False).launch(
        cluster,
        name=f"bench_step_rollout_{tag}",
        placement_strategy=PackedPlacementStrategy(first + 1, first + 1),
    )
    groups.append(rollout)
    host, port = actor.call(ModelSyncWorker.free_port).wait(timeout=60)[0]
    for f in [
        actor.call(ModelSyncWorker.join, host, port),
        rollout.call(ModelSyncWorker.join, host, port),
    ]:
        f.wait(timeout=180)
    mb = actor.call(ModelSyncWorker.nbytes).wait(timeout=60)[0] / 1e6
    versions = {"sent": 0}

    def host_step() -> None:
        packed = actor.call(ModelSyncWorker.export_host).refs[0]
        rollout.call(ModelSyncWorker.load_host, packed).wait(timeout=600)

    def collective_step() -> None:
        versions["sent"] += 1
        pending = [
            actor.call(ModelSyncWorker.send_collective, versions["sent"]),
            rollout.call(ModelSyncWorker.receive_collective, versions["sent"]),
        ]
        for f in pending:
            f.wait(timeout=600)

    for what, step in (("host", host_step), ("collective", collective_step)):
        step()
        a, b = (
            actor.call(ModelSyncWorker.checksum).wait()[0],
            rollout.call(ModelSyncWorker.checksum).wait()[0],
        )
        if a != b:
            raise RuntimeError(f"weight_sync_step: after a {what} step the rollout differs")
    memcpy = f"{label} ({mb:.1f} MB): memcpy in sender"
    return [
        Case(memcpy, lambda: actor.call(ModelSyncWorker.memcpy).wait(120), work=mb, work_unit="MB"),
        # against this model's own memcpy: a copy of the same bytes
        Case(f"{label} ({mb:.1f} MB): host", host_step, work=mb, work_unit="MB", baseline=memcpy),
        Case(
            f"{label} ({mb:.1f} MB): collective",
            collective_step,
            work=mb,
            work_unit="MB",
            baseline=memcpy,
        ),
    ]


@measure(
    "weight_sync_step",
    "one step's weight sync, host vs collective: the default policy and a ~50M-parameter one",
)
def weight_sync_step(quick: bool) -> Suite:
    models: tuple[tuple[dict[str, Any], str], ...] = (({}, "default policy"),)
    if not quick:  # CI (quick) times the default policy only
        models += ((MODEL_50M, "47M policy"),)
    cluster = _cluster(3)  # a pair of devices per model
    groups: list[Any] = []

    def teardown() -> None:
        for g in groups:
            g.shutdown()
        cluster.shutdown()

    try:
        cases = [
            c
            for i, (model, label) in enumerate(models)
            for c in _step_cases(cluster, groups, model, label, 2 * i)
        ]
    except BaseException:
        teardown()
        raise
    return Suite(
        cases=tuple(cases),
        baseline=cases[0].name,
        warmup=1,
        repeats=5,
        note=(
            "float32 weights; per model an actor (sender) on one simulated device and one "
            "rollout process on the next, as in placement=disaggregated; a case is one step's "
            "sync as the trainer runs it (host: the export packs CPU buckets, the object store "
            "carries them, the receiver loads them; collective: the export snapshots buckets, "
            "the gloo broadcast is waited for, the receiver loads them), driver round trips "
            "included. Ratio: against the same model's memcpy in sender."
        ),
        teardown=teardown,
    )
