"""Start a job's workers where the plan says, in one place, and tear everything down after.

Objects are built here and nowhere else: the cluster, the job's reservation, one worker group per
planned component, the residency coordinator fed with each worker's measured state, the metrics
logger and the checkpoint manager. The driver loops receive a :class:`Job` and only call it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rltrain.config import resolve_offload
from rltrain.config.device_checks import simulated_latency_problem
from rltrain.config.engine_checks import simulated_device_gib
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.kinds import registry
from rltrain.placement.micro_batches import adopt_micro_batches
from rltrain.placement.plan import Plan, build_plan, transient_kinds
from rltrain.placement.types import GIB, ClusterSpec
from rltrain.runners.layout import RunLayout, check_launched, layout_for
from rltrain.scheduler import Cluster, WorkerGroup
from rltrain.scheduler.interrupts import check_interrupt, termination_requested
from rltrain.scheduler.residency import ResidencyCoordinator, Resident
from rltrain.telemetry import startup, trace
from rltrain.workers.common import ResidentState


@dataclass
class GroupHandle:
    """Residency handle of one rank: its offload/reload calls return futures."""

    group: WorkerGroup[Any]
    rank: int

    def offload(self, kinds: Sequence[str]) -> Any:
        return self.group.execute_on(self.rank).call(ResidentState.offload, list(kinds))

    def reload(self, kinds: Sequence[str]) -> Any:
        return self.group.execute_on(self.rank).call(ResidentState.reload, list(kinds))


@dataclass
class Job:
    """A running job: its plan, cluster, worker groups and residency coordinator."""

    run: RunConfig
    layout: RunLayout
    cluster: Cluster
    groups: dict[str, WorkerGroup[Any]]
    residency: ResidencyCoordinator
    run_dir: str
    resident_components: tuple[str, ...] = field(default=())

    @property
    def plan(self) -> Plan:
        """The launched job's plan (the devices Ray reported)."""
        return self.layout.plan

    def stage(self, component: str):
        """The residency lease for a stage of ``component`` (a no-op for node-only ones)."""
        if component in self.resident_components:
            return self.residency.stage(component)
        return contextlib.nullcontext()

    def refresh_ledger(self, component: str, state_bytes: Mapping[str, int], rank: int) -> None:
        """Update a rank's full-state sizes (an optimizer's state appears at its first step)
        and note the device peak they make (:meth:`ResidencyCoordinator.refresh`)."""
        self.residency.refresh(component, rank, state_bytes)

    def write_timeline(self) -> dict[str, Any]:
        """Write ``trace.json`` and ``utilization.json``; returns summary fields to merge.

        Returns:
            ``{"utilization": headline numbers}`` (empty when tracing is off).
        """
        if not self.run.logging.trace:
            return {}
        from rltrain.telemetry import timeline

        util = timeline.write_run_timeline(
            self.run_dir, self.cluster.collect_spans(), timeline.plan_devices(self.plan)
        )
        if self.run.logging.progress:
            print(timeline.format_table(util))
        return {"utilization": timeline.headline(util)}

    def verify_ledger(self) -> dict[str, list[dict[str, Any]]]:
        """Ask every model-holding worker for its ledger vs the independent measure.

        Raises:
            WorkerError: a worker holds device memory its ledger does not declare.
        """
        self.residency.flush()  # moves still in flight would make the walk disagree
        return {
            c: self.groups[c].call(ResidentState.memory_report).wait()
            for c in self.resident_components
        }


def _simulated_memory(spec: ClusterSpec, run: RunConfig) -> ClusterSpec:
    """Simulated devices have the capacity the config gives them, also on a Ray started before
    (a test session's, a sweep's): their memory is a modelling choice, not a measurement."""
    configured = int(simulated_device_gib(run.cluster.device_memory_gib) * GIB)
    nodes = tuple(
        dataclasses.replace(n, device_memory_bytes=configured) if n.accelerator_type == "sim" else n
        for n in spec.nodes
    )
    return dataclasses.replace(spec, nodes=nodes)


def _stage_extra(plan: Plan, component: str, device: tuple[int, int]) -> int:
    """One process's share of the plan's transient bytes of ``component`` on ``device`` in its
    largest stage: what its lease adds to the state it measured (a kind the worker measures,
    vLLM's reserved KV cache, is not transient and is counted once, as state). The plan's term
    is the device's total over the component's processes there; each process registers its
    own lease, so each takes its share."""
    memory = plan.memory.get(device)
    if memory is None:
        return 0
    transient = transient_kinds(plan.run)
    total = max(
        (
            sum(t.bytes for t in s.terms if t.component == component and t.kind in transient)
            for s in memory.stages
        ),
        default=0,
    )
    return -(-total // max(_sharers(plan, component, device), 1))


def _sharers(plan: Plan, component: str, device: tuple[int, int]) -> int:
    """How many of ``component``'s processes use ``device``."""
    return sum(
        device in ((p.node_rank, d) for d in p.devices) for p in plan.by_component[component]
    )


def _planned_state(
    plan: Plan, component: str, devices: Sequence[tuple[int, int]], kinds: Sequence[str]
) -> dict[str, int]:
    """The plan's bytes of one process of ``component`` per state kind in ``kinds`` (the kinds
    its worker measures): the ledger's size for a kind the worker has not created yet.

    Returns:
        ``{kind: bytes}``, the largest over the process's devices and the plan's stages, the
        device's term split between the component's processes on it.
    """
    out: dict[str, int] = {}
    for dev in devices:
        memory = plan.memory.get(dev)
        if memory is None:
            continue
        sharers = _sharers(plan, component, dev)
        for s in memory.stages:
            for t in s.terms:
                if t.component == component and t.kind in kinds:
                    share = -(-t.bytes // max(sharers, 1))
                    out[t.kind] = max(out.get(t.kind, 0), share)
    return out


@contextmanager
def start_job(
    run: RunConfig,
    run_dir: str,
    workers: Mapping[str, Callable[[RunLayout], Any]],
    layout: RunLayout | None = None,
    on_launch: Callable[[Mapping[str, WorkerGroup[Any]]], None] | None = None,
) -> Iterator[Job]:
    """Start Ray (or join it), reserve the plan's devices, launch the workers; clean up after.

    The run is laid out again on the cluster Ray reports (:func:`layout_for`) and checked
    against ``layout``, the one checked before Ray started; the workers are built from the
    launched layout.

    Args:
        run: the checked run config.
        run_dir: where the run writes its outputs.
        workers: component -> a function of the launched layout returning the worker class's
            ``create_group(...)`` builder, for every component the runner uses.
        layout: the layout checked before Ray started (:func:`preflight`); None skips the
            comparison (benchmarks and tests that start jobs directly).
        on_launch: called with the groups once all are up, before the residency coordinator
            moves any state (process groups and data-parallel wrappers need the actor's full
            state; only a vLLM rollout put to sleep before the groups sharing its GPUs started
            is away already).

    Yields:
        The running job. On exit (normal, exception or Ctrl-C) every actor and placement group
        the job created is removed and a Ray it started is stopped.

    Raises:
        ResourceError: the launched layout differs from ``layout``.
        SystemExit: ``SystemExit(15)`` when the run (:func:`rltrain.app.train`) recorded
            SIGTERM before the workers launch: none is launched.
    """
    if layout is not None:
        run = adopt_micro_batches(run, layout.run)  # the sizes the plan chose
    os.makedirs(run_dir, exist_ok=True)
    trace.configure(process="driver", enabled=run.logging.trace)
    with Cluster.start(run.cluster) as cluster:
        startup.mark("ray_start")
        check_interrupt()  # a Ctrl-C dropped while Ray started
        if termination_requested():
            # SIGTERM recorded while Ray started (before Ray's own handler, which would have
            # raised this): no worker starts; rltrain.app.train reports a stopped run
            raise SystemExit(signal.SIGTERM)
        plan = build_plan(run, _simulated_memory(cluster.spec, run))  # the discovered cluster
        refuse_simulated_latency(run, plan)
        launched = layout_for(run, plan)
        if layout is not None:
            check_launched(layout, launched)
            launched = dataclasses.replace(
                launched, resume=layout.resume, resume_note=layout.resume_note
            )
        reservation = cluster.reserve(plan, name=f"rltrain-{os.getpid()}", overlap=overlap(run))
        startup.mark("placement_group")

        def launch(comp: str) -> WorkerGroup[Any]:
            with trace.span("launch", comp):
                group = workers[comp](launched).launch(
                    cluster,
                    name=comp,
                    placement_strategy=plan.placements(comp),
                    reservation=reservation,
                    isolate_accelerator=run.placement.isolate_accelerator,
                )
                # each worker process records its own spans: logging.trace=false stops them
                # there too, or they would fill its buffer and never be written
                group.host_call("_rltrain_trace", run.logging.trace).wait()
                return group

        names = [c for c in plan.components if c in workers]
        waves = launch_waves(run, plan, names)
        groups = _launch_wave(waves[0], launch)
        asleep = _sleep_before_sharers(run, groups) if len(waves) > 1 else {}
        for wave in waves[1:]:
            groups.update(_launch_wave(wave, launch))
        groups = {c: groups[c] for c in names}
        startup.mark("workers_ready")
        if on_launch is not None:
            on_launch(groups)
        residency, resident = _residency(run, plan, groups, asleep)
        job = Job(run, launched, cluster, groups, residency, run_dir, resident)
        check_interrupt()  # a Ctrl-C dropped while the workers started
        startup.mark("job_ready")
        yield job
        startup.mark("run_done")


def _launch_wave(
    names: Sequence[str], launch: Callable[[str], WorkerGroup[Any]]
) -> dict[str, WorkerGroup[Any]]:
    """Launch groups at once: a worker's start-up (imports, model build) is seconds of one core,
    and one group waiting for the previous made start-up the sum instead of the max."""
    pool = ThreadPoolExecutor(max_workers=max(len(names), 1))
    try:
        futures = {c: pool.submit(launch, c) for c in names}
        return {c: f.result() for c, f in futures.items()}
    finally:
        # Ctrl-C or a failed launch: leave now, the cluster's teardown ends the others
        pool.shutdown(wait=False, cancel_futures=True)


def launch_waves(run: RunConfig, plan: Plan, names: Sequence[str]) -> list[list[str]]:
    """The groups to launch together, wave after wave.

    A generation engine that reserves a share of its devices' memory (vLLM:
    ``rollout.gpu_memory_utilization``) checks at start-up that the share is free, and sizes its
    KV cache from the memory it sees change while it profiles, counting other processes'
    allocations as its own. So the groups sharing a device with the rollout start only once its
    engine is built; every other run starts all groups at once.

    Args:
        run: the run config.
        plan: the launched plan (which devices each component's processes use).
        names: the components to launch, in plan order.

    Returns:
        One wave (``names``), or the rollout with every group not sharing its devices, then
        the groups that share them.
    """
    generation = run.rollout.backend
    reserves = (
        generation in registry.engine_names("generation")
        and registry.generation_engine(run).kv_reserved
    )
    if "rollout" not in names or not reserves:
        return [list(names)]
    sharers = {c for comps in plan.sharing.values() if "rollout" in comps for c in comps}
    later = [c for c in names if c != "rollout" and c in sharers]
    first = [c for c in names if c not in later]
    return [first, later] if later else [first]


def _sleep_before_sharers(
    run: RunConfig, groups: Mapping[str, WorkerGroup[Any]]
) -> dict[str, list[dict[str, int]]]:
    """Offload the rollout's state now, before the groups sharing its devices build theirs,
    when its policy lets it leave: the plan gives them that room only while it is away.

    Returns:
        ``{"rollout": each rank's full state sizes}``, read before the offload (an engine
        asleep reports no KV cache), or empty when the rollout stays resident.
    """
    group = groups["rollout"]
    policy = resolve_offload(run.placement.offload.get("rollout"), "placement.offload.rollout")
    if not policy.enabled or not issubclass(group.worker_class, ResidentState):
        return {}
    sizes = group.call(ResidentState.state_bytes).wait()
    group.call(ResidentState.offload, sorted(policy.states)).wait()
    return {"rollout": [dict(s) for s in sizes]}


def refuse_simulated_latency(run: RunConfig, plan: Plan) -> None:
    """Refuse ``simulate.*`` latencies once Ray reports real GPUs (a joined cluster's devices are
    only known now; a local machine's were checked before Ray started).

    Raises:
        ConfigError: naming the ``simulate.*`` keys set, before any worker starts.
    """
    gpus = sum(n.num_devices for n in plan.cluster.nodes if n.accelerator_type == "cuda")
    if gpus:
        problem = simulated_latency_problem(run, f"{gpus} CUDA GPU(s) that Ray reports")
        if problem:
            raise ConfigError(problem)


def overlap(run: RunConfig) -> tuple[frozenset[str], ...]:
    """Components whose stages run at the same time in this run (they share the cores)."""
    return registry.runner(run).overlap(run)


def _residency(
    run: RunConfig,
    plan: Plan,
    groups: Mapping[str, WorkerGroup[Any]],
    asleep: Mapping[str, list[dict[str, int]]] | None = None,
) -> tuple[ResidencyCoordinator, tuple[str, ...]]:
    """The residency coordinator, fed with every model-holding rank's state sizes.

    ``asleep`` holds the sizes of components offloaded before the others launched
    (:func:`_sleep_before_sharers`); they are registered with the kinds their policy moved
    already off the device.
    """
    asleep = asleep or {}
    capacity = {
        (node.rank, d): node.device_memory_bytes
        for node in plan.cluster.nodes
        for d in range(node.num_devices)
    }
    coordinator = ResidencyCoordinator(capacity)
    resident = []
    for comp, group in groups.items():
        procs = plan.by_component[comp]
        if not any(p.devices for p in procs) or not issubclass(group.worker_class, ResidentState):
            continue
        sizes = asleep.get(comp) or group.call(ResidentState.state_bytes).wait()
        policy = resolve_offload(run.placement.offload.get(comp), f"placement.offload.{comp}")
        for p, total in zip(procs, sizes, strict=True):
            devices = tuple((p.node_rank, d) for d in p.devices)
            away = {k for k, b in total.items() if b and policy.may_offload(k)}
            coordinator.register(
                Resident(
                    comp,
                    p.rank,
                    devices,
                    policy,
                    dict(total),
                    offloaded=away if comp in asleep else set(),
                    stage_extra=max(_stage_extra(plan, comp, d) for d in devices),
                    planned=_planned_state(plan, comp, devices, tuple(total)),
                ),
                GroupHandle(group, p.rank),
            )
        resident.append(comp)
    # Components that leave after every stage start off the device, so the first stage's
    # lease finds the room the plan promised.
    for comp in resident:
        if coordinator.residents and _policy(coordinator, comp) == "after_stage":
            coordinator.offload_all(comp)
    return coordinator, tuple(resident)


def _policy(coordinator: ResidencyCoordinator, comp: str) -> str:
    whens = {r.policy.when for r in coordinator.residents.values() if r.component == comp}
    return whens.pop() if len(whens) == 1 else "mixed"
