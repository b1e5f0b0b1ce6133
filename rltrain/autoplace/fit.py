"""Which profiling runs to make, and the cost model's terms fitted to what they recorded.

Profiling runs are ordinary short runs of candidate layouts, on node 0's ``n`` devices, chosen
so that each stage is measured in the conditions the candidates run it in:

1. collocated on all ``n`` devices, fused when the run can fuse (one process per device: the
   cheapest run to start), else taking turns (then the memory moves are measured too): the
   stages at ``n`` devices, the fused (or turn-taking) overhead;
2. a split with actor and rollout on separate devices, synchronous and as balanced as the
   checks allow (disaggregated ``n/2 + n/2`` first, then other splits, then hybrid layouts):
   generation and training at fewer devices, each with the node's cores shared as in a split,
   the weight sync, the reward and the driver's time between steps;
3. with ``n >= 4``, a second split (rollout on ``n/4``) for a third point of the scaling.

Embodied runs profile (1) with the configured stage count ``S`` and (2) with another one, so
the item time is seen at two item sizes (:class:`~rltrain.autoplace.cost.Linear`).
:class:`~rltrain.autoplace.cost.Scaling` fits ``t(k)`` to the points. A time limit keeps the
first runs; a layout the checks refuse is replaced by the next one of its slot.

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
from rltrain.kinds import registry


def _splits(devices: int, rollout_share: float) -> list[int]:
    """Rollout device counts of the splits, the one nearest ``rollout_share`` first."""
    target = devices * rollout_share
    return sorted(range(1, devices), key=lambda k: (abs(k - target), k))


def profile_candidates(
    runner: str, node_devices: int, stages: int = 1, num_envs: int = 1
) -> list[list[Candidate]]:
    """The layouts profiled: slots of alternatives, most informative slot first.

    The caller runs the first alternative of each slot that passes the checks (and stops at
    its time limit).

    Args:
        runner: ``reasoning`` or ``embodied``.
        node_devices: devices of node 0 (``n``; profiling stays on one node).
        stages: embodied: the configured ``env.pipeline_stage_num``.
        num_envs: embodied: ``env.num_envs`` (the second stage count must divide it).

    Returns:
        The slots.
    """
    n = node_devices
    every = (0, n)
    embodied = registry.runner(runner).steps_env
    first_stages = stages if embodied else None
    other = (1 if stages != 1 else 2) if embodied else None
    if embodied and num_envs % other:
        other = stages
    slots = [[Candidate("collocated", every, every, fused=not embodied, stages=first_stages)]]
    shares = [0.5, 0.25] if n >= 4 else [0.5]
    for share in shares:
        slot = [
            Candidate("disaggregated", (0, n - k), (n - k, n), stages=other)
            for k in _splits(n, share)
        ]
        if share == 0.5:  # hybrid layouts only as the fall-back of the first split
            slot += [
                Candidate("hybrid", every, (n - k, n), stages=other) for k in _splits(n, share)
            ]
        if slot:
            slots.append(slot)
    if n == 1 and embodied and other != stages:
        slots.append([Candidate("collocated", every, every, stages=other)])
    return slots


def _overhead(reading: RunReading) -> float:
    """Seconds per step outside the stage timers (driver work, logging, the next call)."""
    if reading.period_s is None:
        return 0.0
    return max(reading.period_s - reading.step_s, 0.0)


def fit_reasoning(
    runs: Sequence[tuple[Candidate, RunReading]],
    old_logprob_passes: tuple[int, int] = (0, 0),
    ppo_epochs: int = 1,
) -> ReasoningCosts:
    """The reasoning cost terms from the profiling runs.

    Generation is a point at the run's rollout devices, training at its actor devices. Memory
    moves inside a stage's timer are taken out of it (a rollout's reload and the actor's
    offload happen in the generation's turn, the opposite ones in training's), so that the
    stage times hold for layouts that move nothing; ``moves`` keeps them, per shared device
    count, from the runs whose actor and rollout share devices. The sync and the driver's time
    between steps come from the runs with separate processes; a fused run's overhead is its
    period beyond its ranks' own stage times (the one call per step included).

    The actor's pi_old pass (``P``) is fitted to the runs' ``actor/old_logprobs_s`` when they
    made one; else it is modelled as a third of one epoch's training time (a forward pass
    without the backward, about a third of a forward and backward pass).

    Args:
        runs: ``(profiled layout, reading)`` of each profiling run.
        old_logprob_passes: pi_old passes per step of the profiled (synchronous) runs and of an
            asynchronous candidate (:func:`~rltrain.config.numerics.old_logprob_pass`).
        ppo_epochs: ``algorithm.ppo_epochs`` (the modelled pass is one epoch's forward).

    Returns:
        The fitted costs.

    Raises:
        ValueError: without runs.
    """
    if not runs:
        raise ValueError("fit_reasoning needs at least one profiling run")
    gen, train, moves, syncs, turns_o, fused_o = [], [], [], [], [], []
    for cand, r in runs:
        g_moves = r.move_s("rollout/reload", "actor/offload")
        t_moves = r.move_s("actor/reload", "rollout/offload")
        g = max(r.stages.get("generate", 0.0) - g_moves, 0.0)
        t = max(r.stages.get("train", 0.0) - t_moves, 0.0)
        gen.append((cand.rollout_devices, g))
        train.append((cand.actor_devices, t))
        if r.fused:
            own = g + t + r.stages.get("reward", 0.0)
            fused_o.append(max(r.seconds_per_step - own, 0.0))
            continue
        if cand.shares:
            moves.append((cand.rollout_devices, g_moves + t_moves))
        syncs.append(r.stages.get("sync", 0.0))
        turns_o.append(_overhead(r))
    readings = [r for _, r in runs]
    overhead = statistics.fmean(turns_o) if turns_o else statistics.fmean(fused_o)
    trained = Scaling.fit(train)
    passes = [(c.actor_devices, r.old_logprobs_s) for c, r in runs if r.old_logprobs_s > 0]
    third = 3 * max(ppo_epochs, 1)
    recompute = Scaling.fit(passes) if passes else trained.scaled(1 / third)
    return ReasoningCosts(
        generate=Scaling.fit(gen),
        train=trained,
        reward=statistics.fmean(r.stages.get("reward", 0.0) for r in readings),
        sync=statistics.fmean(syncs) if syncs else 0.0,
        overhead=overhead,
        moves=Scaling.fit(moves),
        fused_overhead=statistics.fmean(fused_o) if fused_o else overhead,
        old_logprobs=recompute,
        old_logprob_passes=old_logprob_passes,
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
        if cand.shares or cand.env is not None:
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
