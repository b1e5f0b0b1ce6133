"""``placement=auto``: profile, enumerate, predict, rank, check, and hand back the winner."""

from __future__ import annotations

import dataclasses
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
    """The candidates of a run on ``total`` devices (pure). ``placement.fuse=false`` leaves the
    fused layout out (``auto``, the preset's, tries it beside the one taking turns)."""
    if registry.runner(run).steps_env:
        stages = stage_counts(run.env.num_envs, settings.pipeline_stages, DEFAULT_STAGES)
        return embodied_candidates(total, stages, settings.candidates)
    found = reasoning_candidates(
        total, settings.candidates, settings.staleness, settings.partial_rollout
    )
    if str(run.placement.fuse).lower() == "false":
        found = [c for c in found if not c.fused]
    return found


def no_candidates(settings: AutoSettings, total: int) -> ConfigError:
    """The error when the settings leave no candidate on the cluster (refused before any
    profiling run).

    Args:
        settings: ``placement.auto.*``.
        total: the cluster's devices.

    Returns:
        The error to raise.
    """
    families = list(settings.candidates)
    fixes = ["add collocated to placement.auto.candidates"] if "collocated" not in families else []
    fixes.append("give the cluster more devices (cluster.devices_per_node, cluster.num_nodes)")
    return ConfigError(
        f"placement.auto.candidates={families} gives no candidate layout on {total} device(s) "
        f"(disaggregated and hybrid layouts need at least 2: the actor and the rollout on "
        f"devices of their own); {' or '.join(fixes)}"
    )


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
    candidate layouts, predict and rank them, check them in that order with what training
    checks of the same layout set by hand (:func:`~rltrain.autoplace.search.check_candidate`),
    and return the fastest valid one.

    Writes ``auto_placement.json`` (ranking, profile, cost terms) and ``auto_placement.txt``
    (the table) into ``run_dir``; profiling runs write under ``run_dir/auto_profile``.

    Args:
        run: the checked run config (``placement.mode=auto``; its layout is only a base: the
            components it places beyond actor, rollout and env, and its offload policies).
        run_dir: the run's output directory.
        settings: ``placement.auto.*``; None reads them from ``run``.

    Returns:
        The choice; ``choice.run`` is what to train (``mode`` unchanged; null micro-batch sizes
        stay null, sized for the winner's layout as a run set by hand is).

    Raises:
        ConfigError: bad ``placement.auto.*`` values, no candidate on the cluster (before
            profiling), or no candidate passes its checks (every candidate's reason listed).
        ResourceError: no profiling run gave a reading (the time limit, or every run failed).
    """
    settings = settings or AutoSettings.from_run(run)
    t0 = time.perf_counter()
    found = enumerate_for(run, settings, devices(run))
    if not found:  # before profiling: its runs would serve no candidate
        raise no_candidates(settings, devices(run))
    enumerate_s = time.perf_counter() - t0
    profile = get_profile(run, settings, os.path.join(run_dir, PROFILE_DIR))
    t0 = time.perf_counter()
    rows = rank(found, profile.costs, carry_busy(run))
    t1 = time.perf_counter() + enumerate_s
    rows = verify(run, rows, settings.max_checked)
    t2 = time.perf_counter() + enumerate_s
    if (winner := pick(rows)) is None:
        raise refusal(rows, settings.max_checked)
    shown, ranking, text = report(run, rows, winner, profile, settings)
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


def report(
    run: Any, rows: Sequence[Row], winner: Row, profile: Profile, settings: AutoSettings
) -> tuple[list[Row], list[dict[str, Any]], str]:
    """The ranking as printed and written: the rows (the winner first), one dict per row with
    the simulator's second opinion, and the table with its header and simulator column."""
    header = f"placement=auto: {len(rows)} candidates; {origin(profile, settings)}"
    text = render(rows, winner, header="\n".join([header, *profile.gaps()]))
    shown = ordered(rows, winner)
    sim = simulated(run, shown, profile)
    text += simulated_text(run, shown, sim)
    ranking = [{**r.to_dict(), "simulated_s_per_step": sim.get(r.candidate.name)} for r in shown]
    return shown, ranking, text


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


def origin(profile: Profile, settings: AutoSettings | None = None) -> str:
    """Where the profile came from and how it was measured, in words (the ranking's first
    line). A cached profile is reused whatever ``placement.auto.profile_steps`` and
    ``profile_passes`` are now (they are not in its key): the line says so where they differ.

    Args:
        profile: the profile.
        settings: this run's ``placement.auto.*`` (None: not compared).

    Returns:
        The text.
    """
    how = profile.how()
    if profile.source != "cache":
        where = (
            f"cached at {profile.path}"
            if profile.path
            else "not cached (the cache keeps its complete profile)"
        )
        made = f"{len(profile.runs)} layouts profiled" + (f", {how}" if how else "")
        return f"profile {profile.key}: measured in {profile.seconds:.1f} s ({made}), {where}"
    text = f"profile {profile.key}: cached {profile.created} ({profile.path})"
    if how:
        text += f", measured with {how}"
    if settings is not None:
        now = dataclasses.replace(
            profile, steps=settings.profile_steps, passes=settings.profile_passes
        ).how()
        if now != how:
            text += (
                f"; not measured again with this run's {now} "
                f"(placement.auto.reprofile=true does that)"
            )
    return text


#: Valid candidates the what-if simulator also predicts (fastest by the cost model first).
SIMULATED = 8


def simulated(run: Any, rows: list[Row], profile: Profile) -> dict[str, float]:
    """The what-if simulator's seconds per step of the valid candidates: a second opinion beside
    the cost model (:mod:`rltrain.whatif`), with the ``whatif.*`` keys as ``mode=plan``'s
    ranking reads them (:func:`simulator_title`). None with ``whatif.rank_candidates=false``,
    nor on real GPUs without ``whatif.hardware`` (the simulator has no model of them)."""
    from rltrain.autoplace.search import candidate_run
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec
    from rltrain.whatif.predict import hardware_needed, predict
    from rltrain.whatif.report import RANK_STEPS

    cluster = ClusterSpec.from_config(run.cluster)
    if not run.whatif.rank_candidates or hardware_needed(run, cluster):
        return {}
    calib = simulator_calibration(run, profile)
    out: dict[str, float] = {}
    for r in [r for r in rows if r.status == "ok"][:SIMULATED]:
        cand_run = candidate_run(run, r.candidate)
        plan = build_plan(cand_run, cluster, check_fit=False)
        p = predict(
            cand_run,
            plan,
            fused=r.candidate.fused,
            calibration=calib,
            steps=RANK_STEPS,
            with_trace=False,
        )
        out[r.candidate.name] = p.step_s
    return out


def simulator_calibration(run: Any, profile: Profile) -> Any:
    """The simulator's calibration: fitted from the profile the ranking used, else the defaults
    (``whatif.calibrate=false``; ``whatif.hardware``, whose devices the profile did not
    measure), as ``mode=plan`` calibrates (:func:`rltrain.whatif.report.calibration`)."""
    from rltrain.whatif.calibrate import DEFAULT, from_profile

    if not run.whatif.calibrate or run.whatif.hardware is not None:
        return DEFAULT
    return from_profile(costs_to_dict(profile.costs), run, profile.path or profile.key)


def simulator_title(run: Any) -> str:
    """What the simulator column predicts, in words (the line above it)."""
    w = run.whatif
    if w.hardware is not None:
        return (
            f"what-if simulator on whatif.hardware={w.hardware} (not this cluster, which the "
            f"cost model's ranking measured), default calibration (s/step):"
        )
    if not w.calibrate:
        return "what-if simulator, default calibration (whatif.calibrate=false) (s/step):"
    return "what-if simulator, calibrated from the same profile (s/step):"


def simulated_text(run: Any, rows: list[Row], sim: dict[str, float]) -> str:
    """One line per simulated candidate: the cost model's and the simulator's s/step."""
    if not sim:
        return ""
    lines = ["", simulator_title(run)]
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
