"""When the actor, the rollout and the rule reward run in one process per device.

In a collocated layout the actor and the rollout hold the same devices and take turns. When
nothing has to move between their turns, separate processes buy nothing and cost a second copy
of the weights per device, a weight export and load per step, and four Ray hops per step
(generate, score, train, export). ``placement.fuse`` runs them in one process per device
instead (verl's fused workers, OpenRLHF's hybrid engine): the rollout samples with the actor's
own parameters, the task's rule reward scores in the same process, and one call per rank does
the whole step (:class:`rltrain.workers.fused.FusedWorker`).

``placement.fuse`` is ``false`` (separate processes), ``true`` (fuse, or refuse the run naming
what stands in the way) or ``auto`` (fuse when nothing stands in the way, else take turns and
say why in ``summary.json``). The rules are pure and decided before Ray starts.
"""

from __future__ import annotations

from typing import Any

from rltrain.config import resolve_offload
from rltrain.config.algorithms import is_batch_wide
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.kinds import registry

#: The components :class:`~rltrain.workers.fused.FusedWorker` runs in one call per rank: a
#: fixed list, since the fused step is written for these three; an entry saying ``fused``
#: joins a fused rank only when it is one of them.
FUSED_WORKER_HOSTS = ("actor", "rollout", "reward")


def fused_components() -> tuple[str, ...]:
    """The components a fused rank runs: those whose entries say ``fused`` and that the fused
    worker hosts (:data:`FUSED_WORKER_HOSTS`)."""
    return tuple(
        n
        for n in registry.component_names()
        if registry.component(n).fused and n in FUSED_WORKER_HOSTS
    )


def _serves_rollout(name: str) -> bool:
    return name in registry.component_names() and registry.component(name).serves_rollout


def fusion_blockers(run: RunConfig, plan: Any) -> list[str]:
    """Why the actor, rollout and reward cannot share processes in this run.

    Args:
        run: the checked run config.
        plan: the placement plan (``by_component``, ``components``, ``memory``).

    Returns:
        One reason per obstacle, each naming the config key; empty when they can.
    """
    return [*_layout_blockers(plan), *_setting_blockers(run), *_memory_blockers(plan)]


def _layout_blockers(plan: Any) -> list[str]:
    """The placement: actor and rollout on the same processes, nothing else placed."""
    out: list[str] = []
    actor = [(p.node_rank, p.devices) for p in plan.by_component.get("actor", ())]
    rollout = [(p.node_rank, p.devices) for p in plan.by_component.get("rollout", ())]
    if actor != rollout or not any(devices for _, devices in actor):
        out.append(
            "placement.component_placement gives actor and rollout different processes "
            f"(actor {actor}, rollout {rollout}): fusing needs the same devices, rank by rank"
        )
    beside = {n for n in plan.components if _serves_rollout(n)}  # tool workers stay apart
    others = sorted(set(plan.components) - set(fused_components()) - beside)
    if others:
        out.append(
            f"the placement also has {others}, which the fused worker does not host (a fused "
            f"step runs only its components' stages in one process){_claims_fused(others)}: "
            f"remove them from placement.component_placement, or set placement.fuse=false"
        )
    return out


def _claims_fused(names: list[str]) -> str:
    """A note on the placed components whose entries say ``fused`` though the fused worker
    does not host them (the flag alone does not make a component join)."""
    claims = [n for n in names if n in registry.component_names() and registry.component(n).fused]
    if not claims:
        return ""
    return (
        f"; the entries of {claims} say fused, but the fused worker hosts only "
        f"{list(FUSED_WORKER_HOSTS)} (rltrain/workers/fused.py)"
    )


def _setting_blockers(run: RunConfig) -> list[str]:
    """Settings that need separate processes (overlap, batch-wide estimators, engines, ...)."""
    out: list[str] = []
    if run.trainer.max_staleness > 0:
        out.append(f"trainer.max_staleness={run.trainer.max_staleness} overlaps the two stages")
    if is_batch_wide(run.algorithm.advantage_estimator):
        out.append(
            f"algorithm.advantage_estimator={run.algorithm.advantage_estimator!r} normalises "
            f"over the whole batch, and a fused rank sees only its own prompt groups"
        )
    if run.algorithm.filter_groups:
        out.append(
            "algorithm.filter_groups=true generates until the step's batch is full, and a fused "
            "rank trains on its own generation only"
        )
    if run.weight_sync.transport != "auto":
        out.append(
            f"weight_sync.transport={run.weight_sync.transport!r} asks for weight sync between "
            f"separate actor and rollout processes (a fused rank has none)"
        )
    if run.reward.kind != "rule":
        out.append(
            f"reward.kind={run.reward.kind!r}: a fused rank scores with the task's rule only"
        )
    for engine in (registry.training_engine(run), registry.generation_engine(run)):
        if not engine.fusable:
            out.append(
                f"{engine.key}={engine.name!r}: only the {_fusable_names(engine.role)} engines "
                f"share parameters in process"
            )
    for section in ("actor", "rollout"):
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(getattr(run, section), name)
            if value != 1:
                out.append(f"{section}.{name}={value}: a fused rank holds the whole model")
    for comp in ("actor", "rollout"):
        key = f"placement.offload.{comp}"
        if resolve_offload(run.placement.offload.get(comp), key).when == "after_stage":
            out.append(f"placement.offload.{comp}.when=after_stage moves state between the stages")
    return out


def _memory_blockers(plan: Any) -> list[str]:
    """A device that cannot hold every fused component's state at once."""
    out: list[str] = []
    for device, memory in sorted(plan.memory.items()):
        total = max((sum(t.bytes for t in s.terms) for s in memory.stages), default=0)
        if total > memory.capacity_bytes:
            out.append(
                f"device {device} cannot hold every component's state at once ({total} bytes > "
                f"{memory.capacity_bytes}): the stages must take turns"
            )
            break
    return out


def _fusable_names(role: str) -> str:
    """The engines of a role that can share parameters in process."""
    names = registry.engine_names(role)
    return " | ".join(n for n in names if registry.engine(role, n).fusable)


def decide_fusion(run: RunConfig, plan: Any) -> tuple[bool, list[str]]:
    """Whether this run fuses, by ``placement.fuse``.

    Args:
        run: the checked run config.
        plan: the placement plan.

    Returns:
        ``(fused, blockers)``: ``blockers`` says why an ``auto`` run did not fuse.

    Raises:
        ConfigError: ``placement.fuse=true`` and something stands in the way.
    """
    mode = str(run.placement.fuse).lower()
    if mode == "false" or not registry.runner(run).fusable:
        return False, []
    blockers = fusion_blockers(run, plan)
    if blockers and mode == "true":
        raise ConfigError(
            "placement.fuse=true but the actor, rollout and reward cannot share processes: "
            + "; ".join(blockers)
            + ". Fix those, or set placement.fuse=auto (take turns when fusing is not possible)"
            " or placement.fuse=false"
        )
    return not blockers, blockers
