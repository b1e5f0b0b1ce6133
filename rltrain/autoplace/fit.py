"""Which profiling runs to make, and the cost model's terms fitted to what they recorded.

Profiling runs are ordinary short runs of candidate layouts that expose each stage on its own:

- reasoning: first actor and rollout on one device as separate processes taking turns (every
  stage is timed by itself, the weight sync and the memory moves included), then fused on
  ``k`` devices for ``k`` = the devices of node 0, then 2, 4, ... below it (one process per
  device: the cheapest run to start; a run that cannot fuse takes turns instead). Each run gives
  generation and training at ``k`` devices, the reward and the driver's time between steps;
  :class:`~rltrain.autoplace.cost.Scaling` fits ``t(k)`` across them.
- embodied: collocated on node 0's devices with the configured stage count ``S``, then on one
  device with another stage count. Each run gives one simulator step and one inference per
  pipeline item (of ``num_envs / S`` environments), the update at ``k`` devices, the sync, the
  moves and the driver's time; :class:`~rltrain.autoplace.cost.Linear` fits item time against
  item size.

Pure: no Ray, no torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rltrain.autoplace.candidates import Candidate
from rltrain.autoplace.cost import (
    EmbodiedCosts,
    Linear,
    ReasoningCosts,
    Scaling,
    items_per_round,
    pipeline_seconds,
)
from rltrain.autoplace.readings import RunReading


def device_counts(node_devices: int) -> list[int]:
    """Reasoning profiling device counts: one (taking turns), then all of node 0's devices,
    then 2, 4, ... below it (they refine the scaling)."""
    out = [1]
    if node_devices > 1:
        out.append(node_devices)
    k = 2
    while k < node_devices:
        out.append(k)
        k *= 2
    return out


def profile_candidates(
    runner: str, node_devices: int, stages: int = 1, num_envs: int = 1
) -> list[Candidate]:
    """The layouts profiled, most informative first (a time limit keeps a prefix).

    Args:
        runner: ``reasoning`` or ``embodied``.
        node_devices: devices of node 0 (profiling stays on one node).
        stages: embodied: the configured ``env.pipeline_stage_num``.
        num_envs: embodied: ``env.num_envs`` (the second stage count must divide it).

    Returns:
        The profiling layouts.
    """
    if runner == "embodied":
        every = (0, node_devices)
        out = [Candidate("collocated", every, every, stages=stages)]
        other = 1 if stages != 1 else 2
        if num_envs % other == 0 and (node_devices > 1 or other != stages):
            out.append(Candidate("collocated", (0, 1), (0, 1), stages=other))
        return out
    return [
        Candidate("collocated", (0, k), (0, k), fused=i > 0)
        for i, k in enumerate(device_counts(node_devices))
    ]


def _overhead(reading: RunReading) -> float:
    """Seconds per step outside the stage timers (driver work, logging, the next call)."""
    if reading.period_s is None:
        return 0.0
    return max(reading.period_s - reading.step_s, 0.0)


def fused(reading: RunReading) -> bool:
    """Whether a reasoning run stepped fused (its driver times the whole ``step``)."""
    return "step" in reading.stages


def fit_reasoning(runs: Sequence[tuple[int, RunReading]]) -> ReasoningCosts:
    """The reasoning cost terms from collocated runs (taking turns or fused).

    Memory moves inside a stage's timer are taken out of it (a rollout's reload and the actor's
    offload happen in the generation's turn, the opposite ones in training's), so that the
    stage times hold for layouts that move nothing; ``moves`` keeps them for layouts that
    share devices. The sync, the moves and the turn-taking driver's overhead come from the runs
    taking turns; a fused run's overhead is its period beyond its ranks' own stage times (the
    one call per step included).

    Args:
        runs: ``(devices, reading)`` of each profiling run.

    Returns:
        The fitted costs.

    Raises:
        ValueError: without runs.
    """
    if not runs:
        raise ValueError("fit_reasoning needs at least one profiling run")
    gen, train, moves, syncs, turns_o, fused_o = [], [], [], [], [], []
    for k, r in runs:
        g_moves = r.move_s("rollout/reload", "actor/offload")
        t_moves = r.move_s("actor/reload", "rollout/offload")
        g = max(r.stages.get("generate", 0.0) - g_moves, 0.0)
        t = max(r.stages.get("train", 0.0) - t_moves, 0.0)
        gen.append((k, g))
        train.append((k, t))
        if fused(r):
            own = g + t + r.stages.get("reward", 0.0)
            fused_o.append(max((r.period_s or r.stages["step"]) - own, 0.0))
        else:
            moves.append((k, g_moves + t_moves))
            syncs.append(r.stages.get("sync", 0.0))
            turns_o.append(_overhead(r))
    readings = [r for _, r in runs]
    overhead = statistics.fmean(turns_o) if turns_o else statistics.fmean(fused_o)
    return ReasoningCosts(
        generate=Scaling.fit(gen),
        train=Scaling.fit(train),
        reward=statistics.fmean(r.stages.get("reward", 0.0) for r in readings),
        sync=statistics.fmean(syncs) if syncs else 0.0,
        overhead=overhead,
        moves=Scaling.fit(moves),
        fused_overhead=statistics.fmean(fused_o) if fused_o else overhead,
    )


def fit_embodied(
    runs: Sequence[tuple[Candidate, RunReading]], num_envs: int, rollout_steps: int
) -> EmbodiedCosts:
    """The embodied cost terms from collocated runs (simulators on node 0: one env process).

    ``time/env_step_s`` is the busiest env process's stepping time in the epoch, so one item
    (one stage stepped once) takes ``env_step_s / (steps x S)``; ``time/infer_s`` is the busiest
    rollout rank's inference time, which served ``steps x q`` items
    (:func:`~rltrain.autoplace.cost.items_per_round`). What the epoch (``time/generate_s``,
    its memory moves taken out) took beyond the pipeline formula applied to those item times is
    ``epoch_overhead``.

    Args:
        runs: ``(profiled candidate, reading)`` pairs.
        num_envs: ``env.num_envs``.
        rollout_steps: ``env.rollout_steps``.

    Returns:
        The fitted costs.

    Raises:
        ValueError: without runs.
    """
    if not runs:
        raise ValueError("fit_embodied needs at least one profiling run")
    env_pts, infer_pts, train, moves, extra = [], [], [], [], []
    for cand, r in runs:
        s = cand.stages or 1
        env_world = max(cand.env_devices, 1)
        m = num_envs / (env_world * s)
        q = items_per_round(env_world, s, cand.rollout_devices)
        e = r.stages.get("env_step", 0.0) / (rollout_steps * s)
        i = r.stages.get("infer", 0.0) / (rollout_steps * q)
        env_pts.append((m, e))
        infer_pts.append((m, i))
        t_moves = r.move_s("actor/reload", "rollout/offload", "env/offload")
        train.append((cand.actor_devices, max(r.stages.get("train", 0.0) - t_moves, 0.0)))
        moves.append((cand.actor_devices, r.move_s()))
        epoch = pipeline_seconds(e, i, s, rollout_steps, env_world, cand.rollout_devices)[0]
        in_epoch = r.stages.get("generate", 0.0) - r.move_s() + t_moves
        extra.append(max(in_epoch - epoch, 0.0))
    readings = [r for _, r in runs]
    return EmbodiedCosts(
        env_item=Linear.fit(env_pts),
        infer_item=Linear.fit(infer_pts),
        train=Scaling.fit(train),
        num_envs=num_envs,
        rollout_steps=rollout_steps,
        sync=statistics.fmean(r.stages.get("sync", 0.0) for r in readings),
        overhead=statistics.fmean(_overhead(r) for r in readings),
        moves=Scaling.fit(moves),
        epoch_overhead=statistics.fmean(extra),
    )
