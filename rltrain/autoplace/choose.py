"""``placement=auto``: profile, enumerate, predict, rank, check, and hand back the winner."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.autoplace.candidates import (
    Candidate,
    apply,
    embodied_candidates,
    reasoning_candidates,
    stage_counts,
)
from rltrain.autoplace.cost import costs_to_dict
from rltrain.autoplace.profile import Profile, get_profile
from rltrain.autoplace.search import UNCHECKED, Row, ordered, pick, rank, render, verify
from rltrain.autoplace.settings import DEFAULT_STAGES, AutoSettings
from rltrain.errors import ConfigError
from rltrain.kinds import registry

#: What :func:`choose` writes into the run directory.
RANKING_FILE = "auto_placement.json"
TEXT_FILE = "auto_placement.txt"
#: Where the profiling runs write, inside the run directory.
PROFILE_DIR = "auto_profile"
#: Excluded candidates a refusal lists (fastest predicted first).
MAX_REASONS = 20


@dataclass(frozen=True)
class AutoChoice:
    """What :func:`choose` decided.

    Attributes:
        run: the winner's run config (``placement.mode`` null: the plan classifies it).
        ranking: one dict per candidate, the winner first (see ``Row.to_dict``).
        text: the ranking as a printable table.
        profile: the profile the predictions came from.
        winner: the winner's row.
        rows: every row (candidate, prediction, check), the winner first.
        search_s: seconds spent enumerating, predicting and ranking (after profiling).
        verify_s: seconds spent checking candidates with the plan and preflight.
    """

    run: Any
    ranking: list[dict[str, Any]]
    text: str
    profile: Profile
    winner: Row
    rows: tuple[Row, ...] = ()
    search_s: float = 0.0
    verify_s: float = 0.0


def devices(run: Any) -> int:
    """The cluster's devices as the config describes it."""
    from rltrain.placement.types import ClusterSpec

    return ClusterSpec.from_config(run.cluster).num_devices


def enumerate_for(run: Any, settings: AutoSettings, total: int) -> list[Candidate]:
    """The candidates of a run on ``total`` devices (pure)."""
    if registry.runner(run).steps_env:
        stages = stage_counts(run.env.num_envs, settings.pipeline_stages, DEFAULT_STAGES)
        return embodied_candidates(total, stages, settings.candidates)
    return reasoning_candidates(
        total, settings.candidates, settings.staleness, settings.partial_rollout
    )


def search(run: Any, profile: Profile, settings: AutoSettings) -> list[Row]:
    """Enumerate and rank (pure; fast on any cluster size)."""
    return rank(enumerate_for(run, settings, devices(run)), profile.costs, carry_busy(run))


def carry_busy(run: Any) -> Callable[[int, int], float]:
    """``(k rollout devices, max_staleness)`` -> the share of a static batch's decoding a
    ``carry`` call takes under the run's response lengths: the carry buffer run by arithmetic
    with the candidate's bound, ``trainer.carry_surplus`` and ``trainer.carry_segment``, its
    deadline included (:func:`rltrain.whatif.slots.carry_share`); memoised (a ranking asks
    once per split)."""
    import functools
    import math

    from rltrain.whatif.lengths import from_config
    from rltrain.whatif.slots import DEFAULT_SEGMENT, carry_share

    model = from_config(run)
    t, n = run.trainer, run.rollout.n_samples_per_prompt
    rows = t.train_batch_size * n
    surplus, segment = t.carry_surplus or 1, t.carry_segment or DEFAULT_SEGMENT

    @functools.cache
    def share(k: int, bound: int) -> float:
        slots = math.ceil(rows / max(k, 1))
        return carry_share(model, slots, n, max(bound, 2), surplus, segment)

    return share


def choose(run: Any, run_dir: str, settings: AutoSettings | None = None) -> AutoChoice:
    """Choose the placement of a run: profile it (or read its cached profile), enumerate the
    candidate layouts, predict and rank them, check them in that order with the plan's memory
    model and preflight, and return the fastest valid one.

    Writes ``auto_placement.json`` (ranking, profile, cost terms) and ``auto_placement.txt``
    (the table) into ``run_dir``; profiling runs write under ``run_dir/auto_profile``.

    Args:
        run: the checked run config (``placement.mode=auto``; its layout is only a base: the
            components it places beyond actor, rollout and env, and its offload policies).
        run_dir: the run's output directory.
        settings: ``placement.auto.*``; None reads them from ``run``.

    Returns:
        The choice; ``choice.run`` is what to train (``mode`` unchanged).

    Raises:
        ConfigError: bad ``placement.auto.*`` values, or no candidate passes its checks (every
            candidate's reason listed).
        ResourceError: no profiling run gave a reading (the time limit, or every run failed).
    """
    settings = settings or AutoSettings.from_run(run)
    profile = get_profile(run, settings, os.path.join(run_dir, PROFILE_DIR))
    t0 = time.perf_counter()
    rows = search(run, profile, settings)
    t1 = time.perf_counter()
    rows = verify(run, rows, settings.max_checked)
    t2 = time.perf_counter()
    winner = pick(rows)
    if winner is None:
        raise refusal(rows, settings.max_checked)
    header = f"placement=auto: {len(rows)} candidates; {origin(profile)}"
    text = render(rows, winner, header="\n".join([header, *profile.gaps()]))
    shown = ordered(rows, winner)
    sim = simulated(run, shown, profile)
    text += simulated_text(shown, sim)
    ranking = [{**r.to_dict(), "simulated_s_per_step": sim.get(r.candidate.name)} for r in shown]
    _write(run_dir, ranking, profile, text, t1 - t0, t2 - t1)
    return AutoChoice(
        run=apply(run, winner.candidate),
        ranking=ranking,
        text=text,
        profile=profile,
        winner=winner,
        rows=tuple(shown),
        search_s=t1 - t0,
        verify_s=t2 - t1,
    )


def refusal(rows: Sequence[Row], max_checked: int) -> ConfigError:
    """The error when no row is valid: each excluded row's reason, and, when
    ``placement.auto.max_checked`` left rows unchecked, how many and the fix.

    Args:
        rows: the checked rows (:func:`~rltrain.autoplace.search.verify`), none valid.
        max_checked: ``placement.auto.max_checked``.

    Returns:
        The error to raise.
    """
    reasons = [f"{r.candidate.name}: {r.reason}" for r in rows if r.reason]
    if len(reasons) > MAX_REASONS:
        more = len(reasons) - MAX_REASONS
        reasons = reasons[:MAX_REASONS] + [f"... and {more} more (fastest predicted first)"]
    unchecked = sum(r.status == UNCHECKED for r in rows)
    if unchecked:
        head = (
            f"placement=auto: none of the {len(rows) - unchecked} candidate layouts checked "
            f"passes the checks training makes, and {unchecked} of the {len(rows)} were not "
            f"checked (placement.auto.max_checked={max_checked}): raise "
            f"placement.auto.max_checked (to {len(rows)} to check every one); each checked "
            f"one's reason follows"
        )
    else:
        head = (
            "placement=auto: no candidate layout passes the checks training makes; each one's "
            "reason follows (give more devices, or lower the memory the run needs)"
        )
    return ConfigError([head, *reasons])


def origin(profile: Profile) -> str:
    """Where the profile came from, in words (the ranking's first line)."""
    if profile.source == "cache":
        return f"profile {profile.key}: cached {profile.created} ({profile.path})"
    where = (
        f"cached at {profile.path}"
        if profile.path
        else "not cached (the cache keeps its complete profile)"
    )
    return (
        f"profile {profile.key}: measured in {profile.seconds:.1f} s "
        f"({len(profile.runs)} layouts profiled), {where}"
    )


#: Valid candidates the what-if simulator also predicts (fastest by the cost model first).
SIMULATED = 8


def simulated(run: Any, rows: list[Row], profile: Profile) -> dict[str, float]:
    """The what-if simulator's seconds per step of the valid candidates, calibrated from the
    same profile (a second opinion beside the cost model: :mod:`rltrain.whatif`)."""
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec
    from rltrain.whatif.calibrate import from_profile
    from rltrain.whatif.predict import predict

    calib = from_profile(costs_to_dict(profile.costs), run, profile.path or profile.key)
    cluster = ClusterSpec.from_config(run.cluster)
    out: dict[str, float] = {}
    for r in [r for r in rows if r.status == "ok"][:SIMULATED]:
        cand_run = apply(run, r.candidate)
        plan = build_plan(cand_run, cluster, check_fit=False)
        p = predict(
            cand_run, plan, fused=r.candidate.fused, calibration=calib, steps=6, with_trace=False
        )
        out[r.candidate.name] = p.step_s
    return out


def simulated_text(rows: list[Row], sim: dict[str, float]) -> str:
    """One line per simulated candidate: the cost model's and the simulator's s/step."""
    if not sim:
        return ""
    lines = ["", "what-if simulator, calibrated from the same profile (s/step):"]
    for r in rows:
        if r.candidate.name in sim:
            lines.append(
                f"  {r.candidate.name:<52} cost model {r.seconds:.4f}  simulator "
                f"{sim[r.candidate.name]:.4f}"
            )
    return "\n".join(lines)


def _write(
    run_dir: str,
    ranking: list[dict[str, Any]],
    profile: Profile,
    text: str,
    search_s: float,
    verify_s: float,
) -> None:
    os.makedirs(run_dir, exist_ok=True)
    doc = {
        "winner": ranking[0]["candidate"],
        "search_s": search_s,
        "verify_s": verify_s,
        "profile": {**profile.to_dict(), "source": profile.source, "path": profile.path},
        "costs": costs_to_dict(profile.costs),
        "ranking": ranking,
    }
    with open(os.path.join(run_dir, RANKING_FILE), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(run_dir, TEXT_FILE), "w") as f:
        f.write(text + "\n")
