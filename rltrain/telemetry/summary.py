"""The per-job result contract: ``summary.json`` in a job's output directory.

A job (the trainer, at the end of a run) writes one summary; the sweep launcher reads every job's
summary to build its comparison report. The file is plain JSON so that other tools can read it
too. Fields the launcher reads (all optional except where a writer has them; a missing field shows
as a blank cell in the report):

==============================  ==========================================================
``placement_mode``              ``collocated`` | ``disaggregated`` | ``hybrid``
``steps``                       policy updates done
``steps_per_s``                 policy updates per second of ``wall_s`` (below)
``tokens_per_s``                generated response tokens per second of ``wall_s`` (reasoning)
``env_steps_per_s``             simulator steps per second of ``wall_s`` (embodied runs)
``seconds_per_stage``           ``{stage: mean seconds per step}``, e.g. ``{"generate": 0.4}``
``peak_memory_bytes_per_device`` ``{"<node>:<device>": bytes}``, e.g. ``{"0:1": 123456}``
``final_reward``                mean reward of the last step
``final_accuracy``              last greedy evaluation accuracy (0..1)
``simulated_devices``           true when devices were simulated on CPU
``status``                      ``completed`` | ``stopped`` | ``failed`` | ``interrupted``
==============================  ==========================================================

The three rates share one time base, the summary's ``wall_s`` (also written): the seconds from
the start of the run's first step to the end of its last, the first step included (its warm-up
too), with the evaluations and checkpoints the loop made after the steps; the start-up before
the first step and the reward curve drawn after the last are not in it. So ``tokens_per_s /
steps_per_s`` is the tokens generated per step, and each rate includes what evaluating and
checkpointing cost (the per-step ``perf/*`` metrics of ``metrics.jsonl`` are rates over a step's
own time, ``time/step_s``).

After restarts (``trainer.max_restarts``) the summary describes the whole run
(:func:`across_attempts`): ``steps`` from the first attempt's start to the last step, ``wall_s``
the training seconds of every attempt (redone steps included), ``steps_per_s`` and
``tokens_per_s`` the steps and the generated tokens over it, the per-step measures and the
``rollout`` totals over every step this invocation recorded (a redone step counted once; the
records an earlier invocation left in a resumed run's ``metrics.jsonl`` are not counted), and
``attempts`` lists each attempt. The peak memory is the final attempt's (a failed attempt's job
is gone before it can report one).

A run that ends with an exception writes its summary too (:func:`rltrain.app.ended_summary`):
``status`` ``failed`` with ``cause`` (the exception in one line) or ``interrupted`` (Ctrl-C), and
the steps and rates of what that invocation finished, measured as after restarts.

No Ray, no torch: this module is imported by the launcher process and by jobs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rltrain.errors import ConfigError

#: Step-record keys summed over the run into ``summary.json``'s ``rollout`` totals.
SUMMED = ("rollout/dropped_samples", "rollout/discarded_tokens", "rollout/continued_tokens")

#: ``carry``: the last step's record counts the groups its rollout still held (never trained).
UNFINISHED = "rollout/unfinished_groups"

#: File name of the summary inside a job's output directory.
SUMMARY_FILE = "summary.json"

#: Fields every consumer may rely on existing (as ``None`` when a writer has no value).
SUMMARY_FIELDS = (
    "placement_mode",
    "steps",
    "steps_per_s",
    "tokens_per_s",
    "env_steps_per_s",
    "seconds_per_stage",
    "peak_memory_bytes_per_device",
    "final_reward",
    "final_accuracy",
    "simulated_devices",
    "status",
)

_NUMBERS = ("steps", "steps_per_s", "tokens_per_s", "env_steps_per_s")
_NUMBERS_OPT = ("final_reward", "final_accuracy")
_MAPPINGS = ("seconds_per_stage", "peak_memory_bytes_per_device")


#: What a job's task function may return to a Hydra sweeper (e.g. Optuna), read from its summary.
OBJECTIVES = {
    "throughput": ("tokens_per_s", "env_steps_per_s", "steps_per_s"),
    "accuracy": ("final_accuracy",),
    "reward": ("final_reward",),
}


def objective(summary: Mapping[str, Any], measure: str = "throughput") -> float | None:
    """The number a sweeper optimises, taken from a job summary.

    Args:
        summary: a job summary (as written by the trainer).
        measure: ``throughput`` (tokens/s, else env steps/s, else steps/s), ``accuracy`` or
            ``reward``.

    Returns:
        The value, or None when the summary lacks it.

    Raises:
        ConfigError: for an unknown ``measure``.
    """
    if measure not in OBJECTIVES:
        raise ConfigError(
            f"objective measure {measure!r} is not valid: choose one of {list(OBJECTIVES)}"
        )
    for key in OBJECTIVES[measure]:
        value = summary.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def per_second(amount: float, seconds: float) -> float | None:
    """``amount / seconds``, None when nothing was measured (no steps run)."""
    return amount / seconds if amount and seconds else None


def generated_tokens(records: list[Mapping[str, Any]]) -> int:
    """Response tokens generated over step records (``metrics.jsonl``'s).

    Each record's rate ``perf/tokens_per_s`` is over its ``time/step_s``, so their product is the
    step's tokens; a record without both adds none.

    Args:
        records: step records.

    Returns:
        The tokens, summed over the records.
    """
    total = 0
    for r in records:
        rate, seconds = r.get("perf/tokens_per_s"), r.get("time/step_s")
        if rate is not None and seconds is not None:
            total += round(float(rate) * float(seconds))  # tokens are whole: drop float error
    return total


def _check(summary: Mapping[str, Any]) -> list[str]:
    """Return a problem message per field of the wrong type (empty when the summary is fine)."""
    problems = []
    for key in (*_NUMBERS, *_NUMBERS_OPT):
        value = summary.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            problems.append(f"summary[{key!r}]={value!r} must be a number or None")
    for key in _MAPPINGS:
        value = summary.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            problems.append(f"summary[{key!r}] must be a mapping, got {type(value).__name__}")
            continue
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, int | float):
                problems.append(f"summary[{key!r}][{k!r}]={v!r} must be a number")
    simulated = summary.get("simulated_devices")
    if simulated is not None and not isinstance(simulated, bool):
        problems.append(f"summary['simulated_devices']={simulated!r} must be true or false")
    return problems


def _jsonable(value: Any) -> Any:
    """NaN and infinities are not JSON: write them as null instead of invalid files."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write_job_summary(run_dir: str | os.PathLike[str], summary: Mapping[str, Any]) -> str:
    """Write ``summary.json`` into a job's output directory (atomically).

    Args:
        run_dir: the job's output directory (Hydra's ``hydra.runtime.output_dir``).
        summary: the fields listed in this module's docstring; extra fields are kept.

    Returns:
        The path of the written file.

    Raises:
        ConfigError: when a known field has the wrong type (the message names the field).
    """
    problems = _check(summary)
    if problems:
        raise ConfigError(problems)
    body = {key: None for key in SUMMARY_FIELDS}
    body.update(_jsonable(dict(summary)))
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(os.fspath(run_dir), SUMMARY_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=2, sort_keys=True)
    # A reader (the launcher) never sees a half-written file.
    os.replace(tmp, path)
    return path


def read_job_summary(run_dir: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """Read a job's ``summary.json``.

    Args:
        run_dir: the job's output directory, or None.

    Returns:
        The summary with every field of :data:`SUMMARY_FIELDS` present (``None`` when the job
        did not write it), or None when there is no summary file or it is not valid JSON (a job
        killed while writing, or one that is not an rltrain trainer).
    """
    if run_dir is None:
        return None
    path = os.path.join(os.fspath(run_dir), SUMMARY_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    out = {key: None for key in SUMMARY_FIELDS}
    out.update(data)
    return out


def across_attempts(
    last: Mapping[str, Any],
    records: list[Mapping[str, Any]],
    attempts: list[Mapping[str, Any]],
    max_staleness: int = 0,
) -> dict[str, Any]:
    """The summary of a run that was restarted, over every attempt.

    Args:
        last: the final attempt's summary (as its runner wrote it).
        records: the run's ``metrics.jsonl`` records (one per step: a restart replaces the
            records of the steps it redoes); those before the first attempt's ``first_step``
            (an earlier invocation's, before a resume) are left out.
        attempts: one record per attempt, oldest first, each with ``first_step``,
            ``done_steps`` and ``training_s`` (as :func:`rltrain.app.train` keeps them).
        max_staleness: ``trainer.max_staleness`` (the bound of the ``rollout`` totals'
            ``within_bound``).

    Returns:
        ``last`` with the whole run's ``steps``, ``wall_s``, ``steps_per_s``,
        ``seconds_per_stage`` (the stages ``last`` lists, over the records kept), ``tokens_per_s``,
        ``env_steps_per_s`` and ``rollout`` totals, plus ``attempts``.
    """
    out = dict(last)
    firsts = [a["first_step"] for a in attempts if a.get("first_step") is not None]
    records = this_invocations(records, min(firsts) if firsts else None)
    done = [a["done_steps"] for a in attempts if a.get("done_steps") is not None]
    steps = max(done) - min(firsts) if firsts and done else last.get("steps")
    seconds = sum(float(a.get("training_s") or 0.0) for a in attempts)
    per_step_env = None
    if last.get("env_steps_per_s") and last.get("steps_per_s"):
        per_step_env = last["env_steps_per_s"] / last["steps_per_s"]
    out["steps"] = steps
    out["wall_s"] = seconds
    out["steps_per_s"] = steps / seconds if steps and seconds else None
    if per_step_env is not None and out["steps_per_s"] is not None:
        out["env_steps_per_s"] = per_step_env * out["steps_per_s"]
    stages = _stage_means(last, records)
    if stages:
        out["seconds_per_stage"] = stages
    tokens = generated_tokens(records)
    if tokens:
        out["tokens_per_s"] = per_second(tokens, seconds)
    since = attempts[-1].get("first_step") if attempts else None
    if since is not None:
        rollout = _rollout_over_attempts(last.get("rollout") or {}, records, since, max_staleness)
        if rollout:
            out["rollout"] = rollout
    out["attempts"] = [dict(a) for a in attempts]
    return out


def this_invocations(
    records: list[Mapping[str, Any]], start: int | None
) -> list[Mapping[str, Any]]:
    """The records from step ``start`` on: ``metrics.jsonl`` also holds the steps of earlier
    invocations into the run directory (a resumed run), and the rates divide by this
    invocation's seconds, so only its steps count (none without a first step).

    Args:
        records: the run directory's ``metrics.jsonl`` records, oldest first.
        start: this invocation's first step (None: it reached none).

    Returns:
        The records of step ``start`` on, and those recording no step.
    """
    return [r for r in records if start is not None and r.get("step", start) >= start]


def _stage_means(last: Mapping[str, Any], records: list[Mapping[str, Any]]) -> dict[str, float]:
    """Mean seconds per step of the stages ``last`` lists (else every ``time/*`` key) over
    ``records``. The runner's own stages only: an embodied step also logs time/env_step_s and
    time/infer_s, parts of generate that would count twice in a sum of the stages."""
    stages = set(last.get("seconds_per_stage") or ()) or {
        k[5:-2] for r in records for k in r if k.startswith("time/") and k != "time/step_s"
    }
    if not records:
        return {}
    n = len(records)
    return {k: sum(float(r.get(f"time/{k}_s") or 0.0) for r in records) / n for k in stages}


def _rollout_over_attempts(
    final: Mapping[str, Any], records: list[Mapping[str, Any]], since: int, max_staleness: int
) -> dict[str, Any]:
    """The whole run's ``rollout`` totals: the final attempt's (``final``: its records, from
    step ``since`` on, and what it left buffered at its end) plus the records of the steps the
    earlier attempts kept (before ``since``; the steps it redid were replaced)."""
    earlier = [r for r in records if r.get("step", since) < since]
    before = run_totals(earlier, max_staleness)
    if not before:
        return dict(final)
    if not final:
        return before
    out = dict(final)
    out["staleness_max"] = max(before["staleness_max"], final["staleness_max"])
    for key in (*(k.split("/", 1)[1] for k in SUMMED), UNFINISHED.split("/", 1)[1]):
        if key in before or key in final:
            out[key] = before.get(key, 0) + final.get(key, 0)
    stale = "rollout/staleness_max"
    n_before = sum(stale in r for r in earlier)
    n_final = sum(stale in r for r in records if r.get("step", since) >= since)
    if n_before + n_final:  # shares of steps: weigh each attempt's by its steps
        within = before["within_bound"] * n_before + final["within_bound"] * n_final
        out["within_bound"] = within / (n_before + n_final)
    return out


def run_totals(
    records: Iterable[Mapping[str, Any]],
    max_staleness: int,
    left: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """``summary.json``'s ``rollout`` totals over the run's step records.

    Every step trains the same number of samples, so shares over steps are shares of samples.

    Args:
        records: the step records (``metrics.jsonl``).
        max_staleness: ``trainer.max_staleness``.
        left: ``carry``: the ``groups`` still buffered when the run stopped after its last
            record (an early stop) and their ``tokens``, counted as discarded.

    Returns:
        ``staleness_max`` (the largest ``rollout/staleness_max`` of any step), the run totals of
        the :data:`SUMMED` keys (``dropped_samples``, ``discarded_tokens``, ``continued_tokens``),
        with ``carry`` ``unfinished_groups`` (groups buffered at the run's end, never trained;
        their tokens are in ``discarded_tokens``), and ``within_bound``, the share of trained
        samples at most ``max_staleness`` versions stale; empty when no step reported
        staleness (a synchronous run).
    """
    steps = [r for r in records if "rollout/staleness_max" in r]
    if not steps:
        return {}
    out: dict[str, Any] = {"staleness_max": max(r["rollout/staleness_max"] for r in steps)}
    for key in SUMMED:
        out[key.split("/", 1)[1]] = sum(int(r.get(key) or 0) for r in steps)
    if left or any(UNFINISHED in r for r in steps):
        out["unfinished_groups"] = sum(int(r.get(UNFINISHED) or 0) for r in steps)
        out["unfinished_groups"] += (left or {}).get("groups", 0)
        out["discarded_tokens"] += (left or {}).get("tokens", 0)
    within = sum(r["rollout/staleness_max"] <= max_staleness for r in steps)
    out["within_bound"] = within / len(steps)
    return out
