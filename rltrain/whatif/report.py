"""``mode=plan``'s prediction: the configured layout's step, and the candidates ranked.

:func:`plan_prediction` is what the plan command calls: it predicts the configured layout
(calibrated from ``placement=auto``'s cached profile of this run when there is one), prints the
seconds per step and per stage, tokens/s and idle share per device, ranks ``placement=auto``'s
candidate layouts by the same simulator (``whatif.rank_candidates``), writes the predicted
timeline beside ``plan.json`` (:data:`TRACE_FILE`) and returns what ``plan.json`` adds.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rltrain.errors import RltrainError
from rltrain.kinds import registry
from rltrain.whatif import candidates as cands
from rltrain.whatif.calibrate import DEFAULT, Calibration, from_profile
from rltrain.whatif.predict import PREDICTED, Prediction, hardware_needed, predict
from rltrain.whatif.profiles import cached_costs

#: The predicted timeline ``mode=plan`` writes next to ``plan.json`` (``trace.json``'s format).
TRACE_FILE = "plan_trace.json"
#: Rows of the ranking printed (all are in ``plan.json``).
TOP = 10
#: Steps each candidate is simulated for in a ranking (the configured layout: ``whatif.steps``).
RANK_STEPS = 6
#: Rollout ranks decoded exactly per step in a ranking (those with the longest and the most
#: tokens: the slowest is among them).
EXACT_RANKS = 8

Fusable = Callable[[Any, Any], bool]
#: ``(candidate run) -> problems``: what training refuses of a candidate's config before Ray.
Screen = Callable[[Any], list[str]]


@dataclass(frozen=True)
class Ranked:
    """One candidate of the ranking: its name, predicted s/step, status and why."""

    name: str
    step_s: float | None
    status: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.name,
            "step_s": self.step_s,
            "status": self.status,
            "reason": self.reason,
        }


def calibration(run: Any, unsized: Any = None) -> Calibration:
    """Calibration from ``placement=auto``'s cached profile of this run (or of ``unsized``, the
    run before its null micro-batch sizes were chosen: auto's key), else the defaults
    (``whatif.calibrate=false``: the defaults; catalogue hardware: defaults too, since a
    profile measures the configured cluster, not that hardware)."""
    w = run.whatif
    if not w.calibrate or w.hardware is not None:
        return DEFAULT
    found = cached_costs(run, unsized)
    if found is None:
        return DEFAULT
    costs, path = found
    return from_profile(costs, run, path)


def rank(
    run: Any,
    cluster: Any,
    fusable: Fusable,
    calib: Calibration,
    unsized: Any = None,
    screen: Screen | None = None,
) -> list[Ranked]:
    """Every ``placement=auto`` candidate of the run on ``cluster``, predicted by the simulator
    and checked with the plan (memory, batch sizes, fusion), fastest first.

    Args:
        run: the run config.
        cluster: the :class:`~rltrain.placement.types.ClusterSpec`.
        fusable: ``(run, plan) -> bool``: whether a fused candidate can run fused.
        calib: the calibration.
        unsized: the run before its null micro-batch sizes were chosen for its own layout
            (None: ``run``'s sizes are the user's); each candidate then gets the largest that
            fits its layout, as that layout set by hand (or chosen by ``placement=auto``) does.
        screen: ``(candidate run) -> problems``: what training refuses of a candidate's config
            before Ray starts (applied before its sizes are chosen); a candidate with problems
            is excluded with the first, as ``placement=auto`` excludes it. None: not screened.

    Returns:
        The ranking (refused candidates last, each with its reason).
    """
    from rltrain.placement.micro_batches import choose_micro_batches
    from rltrain.whatif.predict import hardware_cluster, target_device

    cluster = hardware_cluster(run, cluster, target_device(run))
    out = []
    for cand in _candidates(run, cluster.num_devices):
        cand_run = cands.apply(run if unsized is None else unsized, cand)
        try:
            refused = screen(cand_run) if screen is not None else []
            if refused:
                raise RltrainError(refused[0])
            if unsized is not None:
                cand_run = choose_micro_batches(cand_run, cluster)[0]
            plan = _checked_plan(cand_run, cand, cluster, fusable)
        except RltrainError as exc:
            out.append(Ranked(cand.name, None, "excluded", str(exc).splitlines()[0][:200]))
            continue
        p = predict(
            cand_run,
            plan,
            fused=cand.fused,
            calibration=calib,
            steps=RANK_STEPS,
            with_trace=False,
            planned_on_hardware=True,
            exact_ranks=EXACT_RANKS,
        )
        out.append(Ranked(cand.name, p.step_s, "ok"))
    return sorted(out, key=lambda r: (r.step_s is None, r.step_s or 0.0))


def text(p: Prediction, title: str) -> str:
    """The prediction as printed lines."""
    stages = ", ".join(f"{k} {v:.4g}" for k, v in sorted(p.stages_s.items()))
    lines = [
        f"{title}: {p.step_s:.4g} s/step on {p.hardware} ({p.schedule}; calibration: "
        f"{p.calibration}; {p.steps} steps simulated)",
        f"  seconds per stage: {stages}",
    ]
    devs = list(p.idle_share)
    shown = devs if len(devs) <= 16 else devs[:8] + ["..."] + devs[-4:]
    for d in shown:
        if d == "...":
            lines.append(f"  ... {len(devs) - 12} more devices (all in plan.json)")
            continue
        lines.append(
            f"  {d:<16} {p.tokens_per_s_per_device.get(d, 0.0):>12.4g} tokens/s   idle "
            f"{100 * p.idle_share[d]:5.1f} %"
        )
    if len(devs) > 1:
        lines.append(
            f"  mean over {len(devs)} devices: "
            f"{statistics.fmean(p.tokens_per_s_per_device.values()):.4g} tokens/s, idle "
            f"{100 * statistics.fmean(p.idle_share.values()):.1f} %"
        )
    return "\n".join(lines)


def _candidates(run: Any, devices: int) -> list[Any]:
    """``placement=auto``'s candidates for the run on ``devices`` devices."""
    auto = run.placement.auto
    if registry.runner(run).steps_env:
        stages = cands.stage_counts(run.env.num_envs, list(auto.pipeline_stages), (1, 2, 4, 8))
        return list(cands.embodied_candidates(devices, stages, auto.candidates))
    policies = cands.partial_rollout_policies(auto.partial_rollout, run.trainer.partial_rollout)
    return list(cands.reasoning_candidates(devices, auto.candidates, auto.staleness, policies))


def _checked_plan(cand_run: Any, cand: Any, cluster: Any, fusable: Fusable) -> Any:
    """A candidate's plan on ``cluster``, checked as training checks it (batch sizes, memory,
    fusion).

    Raises:
        RltrainError: the first problem training would refuse.
    """
    from rltrain.placement.plan import build_plan
    from rltrain.placement.sizes import derive_sizes

    if registry.runner(cand_run).language_model:
        derive_sizes(cand_run, cand.actor_devices, cand.rollout_devices)
    plan = build_plan(cand_run, cluster, check_fit=False)
    problems = plan.fit_problems()
    if problems:
        raise RltrainError(problems[0].message())
    if cand.fused and not fusable(cand_run, plan):
        raise RltrainError(
            "cannot run fused (placement.fuse): python -m rltrain mode=plan placement.fuse=true "
            "says why"
        )
    return plan


def ranking_text(rows: list[Ranked], top: int = TOP) -> str:
    """The ranking as a table."""
    lines = [f"{'#':>3}  {'candidate (whatif ranking)':<50} {'pred s/step':>11}  status"]
    for i, r in enumerate(rows[:top], 1):
        sec = "-" if r.step_s is None else f"{r.step_s:.4f}"
        status = r.status if not r.reason else f"{r.status}: {r.reason[:90]}"
        lines.append(f"{i:>3}  {r.name:<50} {sec:>11}  {status}")
    if len(rows) > top:
        lines.append(f"... {len(rows) - top} more (all in plan.json)")
    return "\n".join(lines)


def plan_prediction(
    run: Any,
    plan: Any,
    out_dir: str,
    fusable: Fusable,
    unsized: Any = None,
    screen: Screen | None = None,
) -> dict[str, Any]:
    """Predict the planned run, print it, rank the candidates, write :data:`TRACE_FILE`.

    Args:
        run: the checked run config.
        plan: its plan on the cluster mode=plan resolves it on
            (:func:`~rltrain.whatif.predict.planned_cluster`: whatif.hardware's devices where set).
        out_dir: the plan's directory.
        fusable: ``(run, plan) -> bool``: whether the run's actor, rollout and reward run fused.
        unsized: the run before its null micro-batch sizes were chosen (see :func:`rank`).
        screen: what training refuses of a candidate's config (see :func:`rank`).

    Returns:
        What ``plan.json`` adds: ``predicted`` (and ``predicted_ranking``); nothing on real
        GPUs without ``whatif.hardware`` (:func:`~rltrain.whatif.predict.hardware_needed`,
        printed instead).
    """
    needed = hardware_needed(run, plan.cluster)
    if needed:
        print(needed)
        return {}
    calib = calibration(run, unsized)
    fused = registry.runner(run).fusable and fusable(run, plan)
    t0 = time.perf_counter()
    p = predict(run, plan, fused=fused, calibration=calib, planned_on_hardware=True)
    title = "predicted" if run.whatif.hardware is None else f"what if ({run.whatif.hardware})"
    print(text(p, title))
    with open(os.path.join(out_dir, TRACE_FILE), "w") as f:
        json.dump(p.trace, f)
    out: dict[str, Any] = {PREDICTED: {**p.to_dict(), "seconds": time.perf_counter() - t0}}
    if run.whatif.rank_candidates and plan.cluster.num_devices > 1:
        rows = rank(run, plan.cluster, fusable, calib, unsized, screen)
        print(ranking_text(rows))
        out["predicted_ranking"] = [r.to_dict() for r in rows]
    print(
        f"wrote {os.path.join(out_dir, TRACE_FILE)} (python -m rltrain trace <run dir> "
        f"--predicted {out_dir} draws it beside a run)"
    )
    return out
