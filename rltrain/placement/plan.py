"""The plan: every process of every component, who shares each device, and predicted memory.

:func:`build_plan` resolves a run's ``placement`` against a :class:`ClusterSpec` and predicts,
for every device and every stage of the step, the bytes each component holds there, term by term,
after its offload policy. A plan that cannot fit is refused with a :class:`ResourceError` naming
the device, the shortfall and the settings that would fix it. Pure: no Ray, no torch.

Stages of one step (reasoning runner; embodied runs generate with ``env`` and ``rollout``
together and have no reward stage): ``generate`` (rollout), ``reward`` (a reward model),
``logprob`` (reference, inference), ``train`` (actor, critic), ``sync`` (actor weights to
rollout). In a stage, a component that runs holds all its terms; one that does not holds its
state kinds unless its policy moves them: ``after_stage`` offloads them, ``on_demand`` leaves them
until the device needs the room (:func:`evictions`: the residency coordinator's rule, kind by
kind, only when the stage would not fit otherwise). Activations (and the torch generation
engine's KV cache, :func:`transient_kinds`) exist only while a component runs; the device
context stays while the process lives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, TypeVar

from rltrain.config.offload import OffloadPolicy, resolve_offload
from rltrain.errors import ConfigError, PlacementError, ResourceError
from rltrain.kinds import registry
from rltrain.kinds.records import load
from rltrain.placement import memory as mem
from rltrain.placement.component import (
    ComponentPlacement,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    PlacementMode,
)
from rltrain.placement.constraints import (
    NCCL_GROUP_COMPONENTS,
    check_nccl_group_devices,
    check_weight_sync_layout,
)
from rltrain.placement.sizes import UNCHOSEN_MICRO_BATCH
from rltrain.placement.tools import TOOLS, ToolPool, tool_pool
from rltrain.placement.types import GIB, ClusterSpec, Placement

_ALL = frozenset(mem.KINDS)


def runner_stages(run: Any) -> tuple[tuple[str, Mapping[str, frozenset[str]]], ...]:
    """The stages of one step of the run's runner kind, and the state kinds each component
    uses in each (``*`` in the kind's entry: every state kind).

    In an asynchronous run (``trainer.max_staleness > 0``) the actor trains while the version
    it exported last still waits for its receivers' next generation, so its export buffer
    (``weight_sync``: IPC buckets, the collective transport's snapshot) counts wherever it
    uses every kind (its training stage) too.
    """
    kind = registry.runner(getattr(run, "runner", "reasoning"))
    trainer = getattr(run, "trainer", None)
    held = frozenset({mem.EXPORT_KIND}) if getattr(trainer, "max_staleness", 0) > 0 else frozenset()

    def every_kind(component: str) -> frozenset[str]:
        return _ALL | held if component == "actor" else _ALL

    return tuple(
        (
            stage,
            {c: every_kind(c) if "*" in kinds else frozenset(kinds) for c, kinds in uses.items()},
        )
        for stage, uses in kind.stages
    )


Device = tuple[int, int]


@dataclass(frozen=True)
class MemoryTerm:
    """One component's bytes of one kind on one device in one stage.

    Attributes:
        component: the component.
        kind: ``weights``, ``grads``, ``optimizer``, ``kv_cache``, ``activations`` or ``context``.
        bytes: the size of that state on this device.
        status: ``active`` (the component runs), ``pinned`` (idle but kept by its policy),
            ``evictable`` (idle, ``on_demand``, still resident), ``offloaded`` (off the device).
    """

    component: str
    kind: str
    bytes: int
    status: str

    @property
    def on_device(self) -> int:
        """Bytes this term occupies on the device (0 once offloaded)."""
        return 0 if self.status == "offloaded" else self.bytes


@dataclass(frozen=True)
class StageMemory:
    """A device's memory in one stage.

    Attributes:
        stage: the stage name.
        terms: every term, offloaded ones included (with status ``offloaded``).
        required_bytes: what must be resident: active and pinned terms.
        peak_bytes: predicted occupancy: required plus the evictable terms not evicted.
    """

    stage: str
    terms: tuple[MemoryTerm, ...]
    required_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class DeviceMemory:
    """Predicted memory of one device, per stage (devices with the same load share one record)."""

    capacity_bytes: int
    accelerator_type: str
    stages: tuple[StageMemory, ...]

    @property
    def peak_bytes(self) -> int:
        return max((s.peak_bytes for s in self.stages), default=0)

    @property
    def required_bytes(self) -> int:
        return max((s.required_bytes for s in self.stages), default=0)

    def stage(self, name: str) -> StageMemory:
        """The stage called ``name``.

        Raises:
            KeyError: when the plan has no such stage.
        """
        for s in self.stages:
            if s.stage == name:
                return s
        raise KeyError(f"no stage {name!r}; stages are {[s.stage for s in self.stages]}")


@dataclass(frozen=True)
class PlannedProcess:
    """One process of a component, where it runs."""

    component: str
    rank: int
    placement: Placement

    @property
    def node_rank(self) -> int:
        return self.placement.cluster_node_rank

    @property
    def devices(self) -> tuple[int, ...]:
        """Local device ids on its node (empty for node-only processes)."""
        return self.placement.device_ids


@dataclass(frozen=True)
class FitProblem:
    """A stage that does not fit on a set of identically loaded devices."""

    devices: tuple[Device, ...]
    stage: str
    required_bytes: int
    capacity_bytes: int
    fixes: tuple[str, ...]

    @property
    def shortfall_bytes(self) -> int:
        return self.required_bytes - self.capacity_bytes

    def message(self) -> str:
        node, dev = self.devices[0]
        more = (
            f" (and {len(self.devices) - 1} more devices like it)" if len(self.devices) > 1 else ""
        )
        return (
            f"the plan does not fit: device {dev} of node {node}{more} needs "
            f"{_gib(self.required_bytes)} in stage {self.stage!r}, capacity "
            f"{_gib(self.capacity_bytes)}, short by {_gib(self.shortfall_bytes)}. "
            f"Fix: " + "; or ".join(self.fixes)
        )


def _gib(b: int) -> str:
    if abs(b) < GIB // 100:  # small models (the embodied MLP) would all read "0.00 GiB"
        return f"{b / 1024**2:.2f} MiB"
    return f"{b / GIB:.2f} GiB"


@dataclass(frozen=True, eq=False)
class Plan:
    """A resolved placement with its predicted memory.

    Attributes:
        mode: collocated, disaggregated or hybrid (from the devices components use).
        runner: the runner whose stages the memory prediction follows.
        components: component names in plan order.
        processes: every process of every component, components in plan order, ranks ascending.
        stages: the stage names, in step order.
        sharing: ``(node, device)`` -> components with a process there, in plan order.
        memory: ``(node, device)`` -> predicted memory per stage (shared records for devices
            with the same load).
        weight_sync: actor rank -> rollout ranks it sends weights to (empty without both).
        cluster: the cluster the plan was resolved against.
        by_component: component -> its processes in rank order.
        run: the run config the plan was built from (read for fix suggestions).
        engine_problems: what an engine would refuse at start-up although the memory fits
            (a vLLM engine without room for one sequence of ``max_model_len`` tokens).
        tools: the tool pool (component ``tools``: workers per node, their CPUs and host
            memory against the node's), None without one.
    """

    mode: PlacementMode
    runner: str
    components: tuple[str, ...]
    processes: tuple[PlannedProcess, ...]
    stages: tuple[str, ...]
    sharing: Mapping[Device, tuple[str, ...]]
    memory: Mapping[Device, DeviceMemory]
    weight_sync: Mapping[int, tuple[int, ...]]
    cluster: ClusterSpec
    by_component: Mapping[str, tuple[PlannedProcess, ...]] = dataclasses.field(repr=False)
    run: Any = dataclasses.field(default=None, repr=False, compare=False)
    engine_problems: tuple[str, ...] = ()
    tools: ToolPool | None = None

    def world_size(self, component: str) -> int:
        """Processes of ``component``.

        Raises:
            PlacementError: for a component the plan does not place.
        """
        return len(self._of(component))

    def placements(self, component: str) -> list[Placement]:
        """Placements of ``component`` in rank order.

        Raises:
            PlacementError: for a component the plan does not place.
        """
        return [p.placement for p in self._of(component)]

    def _of(self, component: str) -> tuple[PlannedProcess, ...]:
        try:
            return self.by_component[component]
        except KeyError:
            raise PlacementError(
                f"component {component!r} is not in the plan; it places {list(self.components)}"
            ) from None

    def devices_used(self) -> frozenset[Device]:
        """Every ``(node, local device)`` some process uses."""
        return frozenset(self.sharing)

    def fit_problems(self) -> list[FitProblem]:
        """Stages that need more than a device holds, worst shortfall first."""
        groups: dict[int, list[Device]] = {}
        records: dict[int, DeviceMemory] = {}
        for dev, dm in self.memory.items():
            groups.setdefault(id(dm), []).append(dev)
            records[id(dm)] = dm
        problems = []
        for key, dm in records.items():
            worst = max(dm.stages, key=lambda s: s.required_bytes, default=None)
            if worst is None or worst.required_bytes <= dm.capacity_bytes:
                continue
            problems.append(
                FitProblem(
                    devices=tuple(sorted(groups[key])),
                    stage=worst.stage,
                    required_bytes=worst.required_bytes,
                    capacity_bytes=dm.capacity_bytes,
                    fixes=tuple(_fixes(worst, dm.capacity_bytes, self.run)),
                )
            )
        return sorted(problems, key=lambda p: -p.shortfall_bytes)

    def check_fit(self) -> None:
        """Refuse a plan that cannot fit, or whose engines could not start in their memory.

        Raises:
            ResourceError: naming the device, the stage, the shortfall and the fixes.
        """
        problems = self.fit_problems()
        if problems:
            raise ResourceError(problems[0].message())
        if self.engine_problems:
            raise ResourceError(self.engine_problems[0])
        pool = self.tools.problems() if self.tools is not None else []
        if pool:
            raise ResourceError("; and ".join(pool))


def _policy(run: Any, name: str) -> OffloadPolicy:
    policy = run.placement.offload.get(name) if run.placement.offload else None
    return resolve_offload(policy, f"placement.offload.{name}")


def choose_placement(run: Any, cluster: ClusterSpec) -> ComponentPlacement:
    """The component-placement class for a run: model-parallel for reasoning runs that place
    both actor and rollout, hybrid (no extra constraints) otherwise.

    Raises:
        PlacementError: for a bad ``placement.component_placement``.
    """
    if registry.runner(run).language_model:  # actor and rollout ranks pair up for weight sync
        names = {n.strip() for k in run.placement.component_placement for n in str(k).split(",")}
        if {"actor", "rollout"} <= names:
            return ModelParallelComponentPlacement(run, cluster)
    return HybridComponentPlacement(run, cluster)


def build_plan(run: Any, cluster: ClusterSpec, check_fit: bool = True) -> Plan:
    """Resolve a run's placement on a cluster and predict its memory.

    Args:
        run: the :class:`~rltrain.config.schema.RunConfig` (or an object with its sections).
        cluster: the cluster to plan for.
        check_fit: refuse a plan that does not fit (set False to inspect one that does not).

    Returns:
        The plan.

    Raises:
        PlacementError: for a bad placement, ``placement.mode`` contradicting the layout, or a
            layout the GPU engines cannot run (:func:`check_engine_rules`).
        ConfigError: ``weight_sync.transport`` the layout cannot serve; a bad offload policy or
            unreadable model sizes.
        ResourceError: when ``check_fit`` and some device cannot hold a stage, or a vLLM
            engine has no room for one sequence.
    """
    cp = choose_placement(run, cluster)
    mode = cp.placement_mode
    _check_mode(run, cp, mode)
    names = tuple(cp.components)
    by_component = _shown_job_devices({n: _planned(n, cp.get_placements(n)) for n in names})
    _check_cpu_only(by_component)
    check_engine_rules(run, cluster, by_component)
    processes = tuple(p for n in names for p in by_component[n])
    sharing, signature = _device_loads(names, by_component)
    stages = runner_stages(run)
    stages = tuple(s for s in stages if any(_on_devices(by_component.get(c, ())) for c in s[1]))
    memory = _predict(run, cluster, cp, stages, signature)
    engine_problems = _engine_problems(run, cluster, by_component)
    weight_sync = cp.rollout_rank_map() if isinstance(cp, ModelParallelComponentPlacement) else {}
    plan = Plan(
        mode=mode,
        runner=run.runner,
        components=names,
        processes=processes,
        stages=tuple(s for s, _ in stages),
        sharing=MappingProxyType(sharing),
        memory=MappingProxyType(memory),
        weight_sync=MappingProxyType(weight_sync),
        cluster=cluster,
        by_component=MappingProxyType(by_component),
        run=run,
        engine_problems=tuple(engine_problems),
        tools=_tool_pool(run, cluster, by_component),
    )
    if check_fit:
        plan.check_fit()
    return plan


def _check_cpu_only(by_component: Mapping[str, tuple[PlannedProcess, ...]]) -> None:
    """Refuse devices for a component whose entry says it uses none (``cpu_only``)."""
    for name, procs in by_component.items():
        if name not in registry.component_names() or not registry.component(name).cpu_only:
            continue
        if any(p.devices for p in procs):
            raise PlacementError(
                f"placement.component_placement.{name} gives {name} devices, but it uses no "
                f"accelerator: place it on nodes, e.g. {{node_group: node, placement: "
                f"'0:0-1'}} (two processes on node 0), or leave it out for the default"
            )


def _tool_pool(
    run: Any, cluster: ClusterSpec, by_component: Mapping[str, tuple[PlannedProcess, ...]]
) -> ToolPool | None:
    procs = by_component.get(TOOLS)
    if procs is None:
        return None
    if getattr(run, "tools", None) is None:  # a placement-only config (RLinf's): no sizes
        raise PlacementError(f"{TOOLS} is placed but the config has no tools section")
    if getattr(getattr(run, "task", None), "env", "") is None:
        # No task.env: no pool to size, so tools.pool_size is no fix. The task's checks refuse
        # the placed tools themselves (remove the entry).
        return None
    if len(procs) != run.tools.pool_size:
        raise PlacementError(
            f"placement.component_placement.{TOOLS} places {len(procs)} tool worker(s) but "
            f"tools.pool_size={run.tools.pool_size}: set tools.pool_size={len(procs)}, or leave "
            f"{TOOLS} out of the placement to place tools.pool_size workers on the CPU nodes"
        )
    others = {p.node_rank for n, ps in by_component.items() if n != TOOLS for p in ps}
    return tool_pool(run, cluster, [p.node_rank for p in procs], sorted(others))


def check_engine_rules(
    run: Any, cluster: ClusterSpec, by_component: Mapping[str, tuple[PlannedProcess, ...]]
) -> None:
    """The placement rules the engines impose, checked while planning (so ``mode=plan``
    refuses what the run would).

    * On CUDA devices (``cluster.simulate_devices=false``, or GPUs discovered on
      ``cluster=ray``), no two ranks of one NCCL process group (the actor's, the critic's, the
      inference's data-parallel group) on one GPU. Simulated devices run gloo, which allows it.
    * ``weight_sync.transport=ipc`` only where every GPU of every rollout process hosts an
      actor rank; ``host``, ``collective`` and ``auto`` serve any layout.

    Raises:
        PlacementError: two ranks of an NCCL group on one GPU, naming them and the fix.
        ConfigError: ``weight_sync.transport=ipc`` the layout cannot serve.
    """
    cuda = {n.rank for n in cluster.nodes if n.accelerator_type == "cuda"}

    def devices(name: str, only_cuda: bool = False) -> dict[int, list[tuple[int, int]]]:
        return {
            p.rank: [(p.node_rank, d) for d in p.devices]
            for p in by_component.get(name, ())
            if not only_cuda or p.node_rank in cuda
        }

    if cuda:
        for name in NCCL_GROUP_COMPONENTS:
            if name in by_component:
                check_nccl_group_devices(name, devices(name, only_cuda=True), _placed_as(run, name))
    if "actor" in by_component and "rollout" in by_component:
        sync = getattr(run, "weight_sync", None)
        transport = str(getattr(sync, "transport", "auto") or "auto")
        check_weight_sync_layout(transport, devices("actor"), devices("rollout"))


def _placed_as(run: Any, name: str) -> str:
    """``placement.component_placement['actor,rollout']='0-1:0-3'``: where a component is
    placed, for messages."""
    mapping = run.placement.component_placement or {}
    for key, value in mapping.items():
        if name in (n.strip() for n in str(key).split(",")):
            text = value.get("placement") if hasattr(value, "get") else value
            return f"placement.component_placement[{str(key)!r}]={str(text)!r}"
    return "placement.component_placement"


def _engine_problems(
    run: Any, cluster: ClusterSpec, by_component: Mapping[str, tuple[PlannedProcess, ...]]
) -> list[str]:
    """What the chosen engines' plan-time rules (their entries' ``plan_problems``) report."""
    out: list[str] = []
    for role, comp in (("training", "actor"), ("generation", "rollout")):
        procs = by_component.get(comp, ())
        if not procs:
            continue
        for path in registry.engine(role, getattr(run, comp).backend).plan_problems:
            out += load(path)(run, cluster, procs)
    return out


def _planned(name: str, placements: list[Placement]) -> tuple[PlannedProcess, ...]:
    # PlannedProcess is a frozen dataclass without __post_init__: filling __dict__ builds the
    # same record several times faster than __init__ (10^5 of them in a 1,024-node plan).
    new = object.__new__
    out = []
    for p in placements:
        rec = new(PlannedProcess)
        rec.__dict__.update({"component": name, "rank": p.rank, "placement": p})
        out.append(rec)
    return tuple(out)


def _shown_job_devices(
    by_component: dict[str, tuple[PlannedProcess, ...]],
) -> dict[str, tuple[PlannedProcess, ...]]:
    """A process that is not isolated is shown every device the job reserves on its node (the
    reservation exposes those: ``Reservation.visible_devices``), not every device of the node:
    a device the job leaves to others is never in its ``CUDA_VISIBLE_DEVICES``."""
    wide = [
        p
        for procs in by_component.values()
        for p in procs
        if not p.placement.isolate_accelerator and p.devices
    ]
    if not wide:
        return by_component
    used: dict[int, set[int]] = {}
    for procs in by_component.values():
        for p in procs:
            used.setdefault(p.node_rank, set()).update(p.devices)
    shown = {n: tuple(map(str, sorted(ds))) for n, ds in used.items()}

    def widened(p: PlannedProcess) -> PlannedProcess:
        if p.placement.isolate_accelerator or not p.devices:
            return p
        placement = dataclasses.replace(p.placement, visible_accelerators=shown[p.node_rank])
        return dataclasses.replace(p, placement=placement)

    return {n: tuple(map(widened, procs)) for n, procs in by_component.items()}


def _on_devices(procs: tuple[PlannedProcess, ...]) -> bool:
    return any(p.placement.device_ids for p in procs)


def _check_mode(run: Any, cp: ComponentPlacement, mode: PlacementMode) -> None:
    want = run.placement.mode
    # auto: the layout in the config is only the first one profiled; the winner is concrete
    # and checked as any run's
    if want is None or want == "auto" or want == mode.value:
        return
    sets = "; ".join(
        f"{n}: {_brief_devices(cp.device_set(n))}" for n in cp.components if cp.device_set(n)
    )
    hint = ""
    if "critic" in cp.components and want == "disaggregated":
        # algorithm=ppo adds `critic: all`, which shares every device: the common way here.
        hint = (
            "; for PPO on separate devices use experiment=reasoning_ppo_disaggregated, or give "
            "the critic its own devices with placement.component_placement.critic=<devices>"
        )
    raise PlacementError(
        f"placement.mode={want!r}, but placement.component_placement lays components out as "
        f"{mode.value!r} ({sets}): set placement.mode={mode.value} (or null to skip the check), "
        f"or change the placement{hint}"
    )


def _brief_devices(devs: frozenset[Device], limit: int = 6) -> str:
    items = sorted(devs)
    text = ", ".join(f"{n}:{d}" for n, d in items[:limit])
    return f"{len(items)} devices [{text}{', ...' if len(items) > limit else ''}]"


def _device_loads(
    names: tuple[str, ...], by_component: Mapping[str, tuple[PlannedProcess, ...]]
) -> tuple[dict[Device, tuple[str, ...]], dict[Device, tuple[tuple[str, int], ...]]]:
    """Per device: the components sharing it, and its load signature ((component, devices per
    process) for each process there, in plan order)."""
    load: dict[Device, list[tuple[str, int]]] = {}
    for n in names:
        for proc in by_component[n]:
            pl = proc.placement
            ids = pl.device_ids
            if not ids:
                continue
            item = (n, len(ids))
            node = pl.cluster_node_rank
            for d in ids:
                key = (node, d)
                slot = load.get(key)
                if slot is None:
                    load[key] = [item]
                else:
                    slot.append(item)
    sharing: dict[Device, tuple[str, ...]] = {}
    signature: dict[Device, tuple[tuple[str, int], ...]] = {}
    share_cache: dict[tuple[tuple[str, int], ...], tuple[str, ...]] = {}
    for key in sorted(load):
        sig = tuple(load[key])
        comps = share_cache.get(sig)
        if comps is None:
            comps = share_cache[sig] = tuple(dict.fromkeys(c for c, _ in sig))
        sharing[key] = comps
        signature[key] = sig
    return sharing, signature


def _predict(
    run: Any,
    cluster: ClusterSpec,
    cp: ComponentPlacement,
    stages: tuple[tuple[str, Mapping[str, frozenset[str]]], ...],
    signature: Mapping[Device, tuple[tuple[str, int], ...]],
) -> dict[Device, DeviceMemory]:
    """Memory per device: one record per distinct (load, capacity, device type)."""
    nodes = {n.rank: n for n in cluster.nodes}
    dims = mem.model_dims(run.model)
    policies = {n: _policy(run, n) for n in cp.components}
    transient = transient_kinds(run)
    language = registry.runner(run).language_model  # else weights sync through the host
    terms_cache: dict[tuple[str, int, int, str], dict[str, int]] = {}
    records: dict[tuple[Any, ...], DeviceMemory] = {}
    out: dict[Device, DeviceMemory] = {}
    for dev, sig in signature.items():
        node = nodes[dev[0]]
        key = (sig, node.device_memory_bytes, node.accelerator_type)
        record = records.get(key)
        if record is None:
            per_proc = []
            for comp, ndev in sig:
                tkey = (comp, ndev, node.device_memory_bytes, node.accelerator_type)
                if tkey not in terms_cache:
                    terms_cache[tkey] = component_terms(
                        run, comp, cp.get_world_size(comp), ndev, node, dims
                    )
                terms = terms_cache[tkey]
                if comp == "actor" and language and export_on_device(run, node, sig):
                    params = mem.param_count(dims)
                    mp = run.actor.tensor_parallel_size * run.actor.pipeline_parallel_size
                    export = mem.ipc_export_bytes(params, dims.dtype, mp)
                    terms = {**terms, mem.EXPORT_KIND: export}
                per_proc.append((comp, ndev, terms))
            record = records[key] = DeviceMemory(
                capacity_bytes=node.device_memory_bytes,
                accelerator_type=node.accelerator_type,
                stages=tuple(
                    _stage_memory(
                        s, active, per_proc, policies, node.device_memory_bytes, transient
                    )
                    for s, active in stages
                ),
            )
        out[dev] = record
    return out


def export_on_device(run: Any, node: Any, load: tuple[tuple[str, int], ...]) -> bool:
    """Whether an actor process on a device with this load holds a packed copy of its weights
    there while it exports them (the ``weight_sync`` term): CUDA-IPC buckets
    (:func:`ipc_export_here`), else the snapshot an NCCL broadcast sends from a CUDA device
    under ``weight_sync.transport`` ``collective`` or ``auto`` (which picks NCCL where the
    receivers have GPUs of their own; planned wherever IPC is not, so the plan never
    under-counts; later versions wait on the host). Under gloo the snapshot is host memory."""
    if ipc_export_here(run, node, load):
        return True
    return node.accelerator_type == "cuda" and run.weight_sync.transport in ("auto", "collective")


def ipc_export_here(run: Any, node: Any, load: tuple[tuple[str, int], ...]) -> bool:
    """Whether an actor process on a device with this load may export CUDA-IPC buckets: a
    CUDA device it shares with a weight receiver, under ``weight_sync.transport`` ``ipc`` or
    ``auto`` (which picks IPC where every receiver GPU hosts an actor rank; planned wherever
    it might, so the plan never under-counts)."""
    if node.accelerator_type != "cuda" or run.weight_sync.transport not in ("auto", "ipc"):
        return False
    receivers = registry.weight_receivers()
    return any(c in receivers for c, _ in load)


def micro_batch(run: Any, micro: int | None, dp: int) -> int:
    """Sequences one forward (and backward) holds: the component's micro-batch, but no more
    rows than a rank gets per optimizer step in a reasoning run
    (``ceil(train_batch_size · n_samples_per_prompt / dp) // num_minibatches``, as the runner's
    batch sizes cut it).

    Args:
        run: the run config.
        micro: the component's ``micro_batch_size``.
        dp: the component's data-parallel size.

    Returns:
        The rows of one micro-batch, at least 1.
    """
    if micro is None:  # not chosen yet (rltrain.placement.micro_batches chooses at the start)
        micro = UNCHOSEN_MICRO_BATCH
    if not registry.runner(run).language_model:
        return max(1, micro)
    rows = mem.rollout_batch_per_process(
        run.trainer.train_batch_size, run.rollout.n_samples_per_prompt, max(dp, 1)
    )
    per_step = rows // max(1, int(getattr(run.algorithm, "num_minibatches", 1) or 1))
    return max(1, min(micro, max(per_step, 1)))


def component_terms(
    run: Any, name: str, world: int, ndev: int, node: Any, dims: mem.ModelDims
) -> dict[str, int]:
    """Bytes one process of ``name`` holds over its ``ndev`` devices, per kind.

    Sequences are as long as the run makes them (:func:`~rltrain.placement.memory.
    sequence_length`: ``task.max_prompt_length + rollout.max_new_tokens``), a forward holds one
    micro-batch (:func:`micro_batch`).

    Args:
        run: the run config.
        name: the component.
        world: the component's number of processes.
        ndev: devices the process spans.
        node: the :class:`NodeSpec` (device memory and type).
        dims: the policy model's sizes.

    Returns:
        ``{kind: bytes}``; kinds that do not apply are left out.
    """
    params = mem.value_param_count(dims) if name == "critic" else mem.param_count(dims)
    seq = mem.sequence_length(run, dims)
    t: dict[str, int] = {}
    if not registry.runner(run).language_model:
        t = _policy_terms(run, name, world)
    elif name in ("actor", "critic"):
        t = _trainer_terms(run, name, world, dims, params, seq)
    elif name in ("reference", "inference"):
        sec = getattr(run, name)
        tp = getattr(sec, "tensor_parallel_size", 1)
        mp = tp * getattr(sec, "pipeline_parallel_size", 1)
        t["weights"] = mem.weight_bytes(params, dims.dtype, mp)
        b = micro_batch(run, sec.micro_batch_size, max(world // mp, 1))
        t["activations"] = mem.activation_bytes(b, seq, dims, tp, False, **_logits(run, "forward"))
    elif name == "reward" and run.reward.kind == "model" and run.reward.model_path:
        # the worker loads the checkpoint in the dtype it was saved in (transformers' "auto")
        saved = mem.saved_dtype(run.reward.model_path) or dims.dtype
        rdims = mem.checkpoint_dims(run.reward.model_path, saved)
        t["weights"] = mem.weight_bytes(mem.reward_param_count(rdims), saved)
        micro = getattr(run.reward, "micro_batch_size", None) or run.actor.micro_batch_size
        b, seq = micro_batch(run, micro, world), mem.sequence_length(run, rdims)
        # A sequence classifier's score head gives one output per token, not vocabulary logits.
        t["activations"] = mem.activation_bytes(b, seq, rdims, 1, False, outputs_per_token=1)
    elif name == "rollout":
        t = _rollout_terms(run, world, ndev, node, dims, params, seq)
    t["context"] = mem.context_bytes(node.accelerator_type) * ndev
    return {k: v for k, v in t.items() if v}


@lru_cache(maxsize=16)
def _env_spaces(probe: str, env_id: str) -> tuple[int, int, bool]:
    """``(obs_dim, action_dim, continuous)`` of a simulator, read as the workers read them (the
    runner kind's ``env_spaces``: one CPU copy, built and closed)."""
    try:
        read = load(probe)
    except ImportError as exc:  # gymnasium missing: the run could not start either
        raise ConfigError(
            f"task.env_id={env_id!r}: the plan reads the environment's spaces to size the "
            f"policy, and cannot ({exc}): install gymnasium"
        ) from None
    spec = read(env_id)
    return spec.obs_dim, spec.action_dim, spec.action_kind == "continuous"


def policy_dims(run: Any) -> mem.PolicyDims:
    """The embodied actor-critic's sizes: the environment's spaces (``task.env_id``) and
    ``model.hidden_size`` / ``model.num_layers``.

    Raises:
        ConfigError: an environment Gymnasium cannot build, or spaces the policy does not take.
    """
    probe = registry.runner(run).env_spaces
    if probe is None:
        raise ConfigError(f"runner={run.runner!r} steps no simulator whose spaces size a policy")
    obs, actions, continuous = _env_spaces(probe, str(run.task.env_id))
    return mem.PolicyDims(obs, actions, continuous, run.model.hidden_size, run.model.num_layers)


def _policy_terms(run: Any, name: str, world: int) -> dict[str, int]:
    """One process's bytes for a runner whose policy is not a language model (the embodied
    actor-critic MLP): the actor trains it with AdamW on the whole epoch's transitions, the
    rollout holds a copy and infers one pipeline stage of observations at a time (no KV cache);
    the simulators hold no device memory. A stage serves ``env.num_envs /
    env.pipeline_stage_num`` observations at most (fewer with several env processes)."""
    if name not in ("actor", "rollout"):
        return {}
    d = policy_dims(run)
    params = mem.policy_param_count(d)
    dt = mem.POLICY_DTYPE
    t = {"weights": mem.weight_bytes(params, dt)}
    if name == "rollout":
        rows = -(-run.env.num_envs // max(run.env.pipeline_stage_num, 1))
        t["activations"] = mem.policy_infer_activation_bytes(rows, d)
        return t
    transitions = run.env.num_envs * run.env.rollout_steps
    minibatches = max(int(run.algorithm.num_minibatches), 1)
    rows = -(-transitions // (minibatches * max(world, 1)))
    t["grads"] = mem.grad_bytes(params, dt)
    t["optimizer"] = mem.optimizer_bytes(params, dt)
    t["activations"] = mem.policy_train_activation_bytes(transitions, rows, d)
    return t


def _trainer_terms(
    run: Any, name: str, world: int, dims: mem.ModelDims, params: int, seq: int
) -> dict[str, int]:
    """The actor's or the critic's weights, gradients, optimizer state and activations."""
    dt = dims.dtype
    sec = run.actor if name == "actor" else run.critic
    tp, pp = (run.actor.tensor_parallel_size, run.actor.pipeline_parallel_size)
    if name == "critic":
        tp, pp = 1, 1
    zero = run.actor.zero_stage if name == "actor" else 0
    dp = max(world // (tp * pp), 1)
    z = mem.zero_divisors(zero, dp)
    held, trained = (params, params)
    if name == "actor":  # LoRA: gradients and Adam state for the adapters only
        held, trained = mem.actor_param_counts(run, dims, params)
    t = {
        "weights": mem.weight_bytes(held, dt, tp * pp * z["weights"]),
        "grads": mem.grad_bytes(trained, dt, tp * pp * z["grads"]),
        "optimizer": mem.optimizer_bytes(trained, dt, tp * pp * z["optimizer"]),
    }
    ckpt = bool(getattr(run.actor, "gradient_checkpointing", False)) and name == "actor"
    out = 1 if name == "critic" else None  # a value per token, not vocabulary logits
    # A token budget bounds a micro-batch's tokens, whatever its rows (up to a minibatch).
    budget = getattr(run.actor, "max_tokens_per_micro_batch", None) if name == "actor" else None
    b = micro_batch(run, sec.micro_batch_size if budget is None else budget, dp)
    entropy = "train_entropy" if run.algorithm.entropy_coef else "train"
    t["activations"] = mem.activation_bytes(
        b,
        seq,
        dims,
        tp,
        True,
        ckpt,
        outputs_per_token=out,
        max_tokens=budget,
        **_logits(run, entropy),
    )
    return t


def _logits(run: Any, kind: str) -> dict[str, Any]:
    """The response tokens a log-prob pass takes logits for, and its fp32 copies at the peak."""
    new = int(getattr(run.rollout, "max_new_tokens", 0) or 0) or None
    return {"response_len": new, "logit_copies": mem.LOGIT_COPIES[kind]}


def _rollout_terms(
    run: Any, world: int, ndev: int, node: Any, dims: mem.ModelDims, params: int, seq: int
) -> dict[str, int]:
    """The rollout's weights and KV cache: a reserved share of the device for an engine whose
    entry says ``kv_reserved`` (vLLM), else sized by the batch it generates."""
    t = {"weights": mem.weight_bytes(params, dims.dtype)}
    r = run.rollout
    if registry.generation_engine(run).kv_reserved:
        reserved = mem.vllm_reserved_bytes(r.gpu_memory_utilization, node.device_memory_bytes, ndev)
        t["kv_cache"] = max(reserved - t["weights"], 0)
    else:
        batch = mem.rollout_batch_per_process(
            run.trainer.train_batch_size, r.n_samples_per_prompt, world
        )
        t["kv_cache"] = mem.kv_cache_bytes(batch, seq, dims)
    return t


def transient_kinds(run: Any) -> frozenset[str]:
    """Kinds of predicted memory that exist only while their component's stage runs: what the
    plan leaves out of the other stages and the residency ledger adds for a stage's lease
    (everything else a worker holds is state its ledger measures).

    Args:
        run: the run config (its generation engine decides whether ``kv_cache`` is transient).

    Returns:
        :func:`~rltrain.placement.memory.transient_kinds` for the run's generation engine.
    """
    return frozenset(mem.transient_kinds(registry.generation_engine(run).kv_reserved))


K = TypeVar("K")


def evictions(movable: Mapping[K, Mapping[str, int]], room: int) -> list[tuple[K, str, int]]:
    """Which idle state leaves a device so that ``room`` more bytes are free: the one rule the
    plan predicts with and the residency coordinator evicts by.

    The holder with the most movable bytes goes first (ties by key), and of a holder its largest
    kinds first (ties by name), one kind at a time, stopping as soon as the room is made; kinds
    of 0 bytes never move.

    Args:
        movable: per holder (a component in the plan, ``(component, rank)`` in the ledger), the
            bytes per kind its policy lets leave and that are on the device now.
        room: bytes to free; nothing moves when it is 0 or less.

    Returns:
        ``(holder, kind, bytes)`` in eviction order; short of ``room`` when everything movable
        is not enough.
    """
    out: list[tuple[K, str, int]] = []
    holders = sorted(movable.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    for key, kinds in holders:
        for kind, b in sorted(kinds.items(), key=lambda kb: (-kb[1], kb[0])):
            if room <= 0:
                return out
            if b > 0:
                out.append((key, kind, b))
                room -= b
    return out


def _stage_memory(
    stage: str,
    active: Mapping[str, frozenset[str]],
    per_proc: list[tuple[str, int, dict[str, int]]],
    policies: Mapping[str, OffloadPolicy],
    capacity: int,
    transient: frozenset[str] = frozenset(mem.TRANSIENT_KINDS),
) -> StageMemory:
    """One device's terms in one stage, after offload policies and on-demand eviction
    (:func:`evictions`); ``transient`` kinds count only for the components that run."""
    sizes: dict[tuple[str, str, str], int] = {}
    for comp, ndev, terms in per_proc:
        uses = active.get(comp, frozenset())
        policy = policies.get(comp) or OffloadPolicy()
        for kind, b in terms.items():
            share = -(-b // ndev)
            if kind in uses or kind == "context":
                status = "active" if uses else "pinned"
            elif kind in transient:
                continue  # freed when the component's stage ends
            elif not policy.may_offload(kind):
                status = "pinned"
            elif policy.when == "after_stage":
                status = "offloaded"
            else:
                status = "evictable"
            k = (comp, kind, status)
            sizes[k] = sizes.get(k, 0) + share
    terms = [MemoryTerm(c, k, b, s) for (c, k, s), b in sizes.items()]
    required = sum(t.bytes for t in terms if t.status in ("active", "pinned"))
    evictable: dict[str, dict[str, int]] = {}
    for t in terms:
        if t.status == "evictable":
            evictable.setdefault(t.component, {})[t.kind] = t.bytes
    held = sum(b for kinds in evictable.values() for b in kinds.values())
    evicted = {(c, k) for c, k, _ in evictions(evictable, required + held - capacity)}
    if evicted:
        terms = [
            MemoryTerm(t.component, t.kind, t.bytes, "offloaded")
            if t.status == "evictable" and (t.component, t.kind) in evicted
            else t
            for t in terms
        ]
    peak = sum(t.on_device for t in terms)
    return StageMemory(stage, tuple(terms), required, peak)


def _half_precision_fix(stage: StageMemory, run: Any) -> tuple[int, str] | None:
    """A float32 checkpoint: bfloat16 halves its weights, gradients and activations (the fp32
    optimizer state stays). Offered for checkpoints (``model.path``), where real sizes make the
    dtype matter; the tiny models built from the fields stay float32."""
    if run is None or getattr(run.model, "dtype", None) != "float32" or not run.model.path:
        return None
    kinds = ("weights", "grads", "activations", "kv_cache")
    halved = sum(t.bytes for t in stage.terms if t.kind in kinds and t.status != "offloaded") // 2
    if not halved:
        return None
    return (
        halved,
        f"train in bfloat16: model.dtype=bfloat16 (now float32; halves weights, gradients and "
        f"activations: frees about {_gib(halved)})",
    )


def _zero_engine() -> str:
    """The training engines that shard optimizer state (``actor.zero_stage``)."""
    names = registry.engine_names("training")
    return " | ".join(n for n in names if registry.engine("training", n).zero)


def _fixes(stage: StageMemory, capacity: int, run: Any) -> list[str]:
    """Settings that would free room in a stage that does not fit, most effective first.

    A fix is only offered where it changes something: never a setting that is already on
    (gradient checkpointing on, the optimizer already sharded, a micro-batch of 1, a state
    kind the offload policy already moves).
    """
    need = stage.required_bytes - capacity
    out = _offload_fixes(stage, run)
    shorten = False
    language = run is None or registry.runner(run).language_model
    for t in stage.terms if run is not None else ():
        if t.status == "offloaded":
            continue
        if not language:  # sized by the env and network keys, not by sequences
            out += _policy_fixes(t, run)
            continue
        fix, shorter = _term_fix(t, run)
        out += [fix] if fix is not None else []
        shorten = shorten or shorter
    if shorten and run is not None:
        out.append((0, _shorten_fix(run)))
    half = _half_precision_fix(stage, run)
    if half is not None:
        out.append(half)
    out.sort(key=lambda x: -x[0])
    fixes = [text for _, text in out[:3]]
    bigger = f"devices with more than {_gib(capacity + need)} (cluster.device_memory_gib)"
    if len({t.component for t in stage.terms if t.on_device}) > 1:
        fixes.append(
            f"give the components devices of their own (placement=disaggregated) or {bigger}"
        )
    else:
        fixes.append(bigger)
    return fixes


def _shorten_fix(run: Any) -> str:
    """The fix that shortens sequences, saying so where the model's positions cap them: then
    lowering the prompt or response length changes nothing until their sum is below the cap."""
    prompt = run.task.max_prompt_length
    new, keys = mem.response_budget(run)
    cap = mem.model_dims(run.model).max_position_embeddings
    if prompt + new > cap:
        return (
            f"shorten the sequences: task.max_prompt_length={prompt} + {keys} exceed the "
            f"model's {cap} positions (model.max_position_embeddings), which bound them: bring "
            f"the sum below {cap}"
        )
    return (
        f"shorten the sequences: task.max_prompt_length (now {prompt}) or rollout.max_new_tokens "
        f"(now {run.rollout.max_new_tokens})"
    )


def _policy_fixes(t: MemoryTerm, run: Any) -> list[tuple[int, str]]:
    """(bytes freed, fix) for one term of a runner whose policy is not a language model (the
    embodied MLP): its sizes come from the env and network keys, not from sequences."""
    env, alg, model = run.env, run.algorithm, run.model
    if t.status != "active" or t.kind == "context":
        return []
    if t.kind == "activations" and t.component == "actor":
        text = (
            f"lower env.num_envs (now {env.num_envs}) or env.rollout_steps (now "
            f"{env.rollout_steps}), or raise algorithm.num_minibatches (now "
            f"{alg.num_minibatches}) (activations {_gib(t.bytes)})"
        )
    elif t.kind == "activations":
        text = (
            f"raise env.pipeline_stage_num (now {env.pipeline_stage_num}) or lower "
            f"env.num_envs (now {env.num_envs}) ({t.component} activations {_gib(t.bytes)})"
        )
    elif t.kind == "weights" and t.component == "actor":
        # weights, gradients and Adam's two moments all scale with the parameter count
        text = (
            f"a smaller network: lower model.hidden_size (now {model.hidden_size}) or "
            f"model.num_layers (now {model.num_layers})"
        )
        return [(t.bytes * 2, text)]
    else:
        return []
    return [(t.bytes // 2, text)]


def _offload_fixes(stage: StageMemory, run: Any) -> list[tuple[int, str]]:
    """(bytes freed, fix): offload each component whose state is pinned in the stage."""
    out: list[tuple[int, str]] = []
    pinned: dict[str, list[MemoryTerm]] = {}
    for t in stage.terms:
        if t.status == "pinned" and t.kind != "context":
            pinned.setdefault(t.component, []).append(t)
    for comp, ts in pinned.items():
        kinds = {t.kind for t in ts}
        policy = _policy(run, comp) if run is not None else OffloadPolicy()
        when = policy.when if policy.when != "never" else "after_stage"
        states = sorted(kinds | (set(policy.states) if policy.when != "never" else set()))
        freed = sum(t.bytes for t in ts)
        out.append(
            (
                freed,
                f"offload {comp} while it is idle: placement.offload.{comp}="
                f"{{when: {when}, states: [{', '.join(states)}]}} (frees {_gib(freed)})",
            )
        )
    return out


def _term_fix(t: MemoryTerm, run: Any) -> tuple[tuple[int, str] | None, bool]:
    """``(fix or None, whether shorter sequences would help)`` for one term of a stage."""
    if t.component == "rollout" and t.kind == "kv_cache":
        if not registry.generation_engine(run).kv_reserved:
            return None, True
        util = run.rollout.gpu_memory_utilization
        text = f"lower rollout.gpu_memory_utilization (now {util}; kv cache {_gib(t.bytes)})"
        return (t.bytes // 2, text), False
    if t.status != "active":
        return None, False
    if t.component == "actor" and t.kind == "optimizer" and run.actor.zero_stage < 1:
        how = "" if registry.training_engine(run).zero else f"actor.backend={_zero_engine()} "
        text = (
            f"shard the optimizer: {how}actor.zero_stage=1 (or higher) over more "
            f"data-parallel devices"
        )
        return (t.bytes // 2, text), False
    if t.kind != "activations":
        return None, False
    ways = _activation_ways(t, run)
    if not ways:
        return None, True
    return (t.bytes // 2, f"{' or '.join(ways)} (activations {_gib(t.bytes)})"), True


def _activation_ways(t: MemoryTerm, run: Any) -> list[str]:
    """Settings that shrink a component's activations and are not already at their limit."""
    sec = getattr(run, t.component, None)
    micro = getattr(sec, "micro_batch_size", 1) if sec is not None else 1
    micro = UNCHOSEN_MICRO_BATCH if micro is None else micro
    ways = []
    budget = getattr(sec, "max_tokens_per_micro_batch", None)
    if t.component == "actor" and budget is not None:  # rows do not bound it then
        row = run.task.max_prompt_length + run.rollout.max_new_tokens
        if budget > row:
            ways.append(f"lower actor.max_tokens_per_micro_batch (now {budget}, >= {row})")
    elif micro > 1:
        ways.append(f"lower {t.component}.micro_batch_size (now {micro})")
    if t.component == "actor" and not run.actor.gradient_checkpointing:
        ways.append("enable actor.gradient_checkpointing")
    return ways
