"""What a finished run recorded, read back for the cost model and the benchmark.

A run writes ``metrics.jsonl`` (one record per step with ``time/<stage>_s``) and, with
``logging.trace=true``, ``trace.json`` (every span: the driver's one per step, the workers'
``offload`` / ``reload``). From them :func:`read_run` takes, over the *timed* steps (after the
warm-up steps, before the last one, which is followed by evaluation and the checkpoint, unless
it is the only one left: with one warm-up step, a two-step run times its second step):

- each stage's mean seconds per step (the runner's own timers);
- the step *period*: the median time from one step's start to the next one's (the driver's
  per-step span), which is what a step really costs, driver work between steps included; the
  median, because the machines these runs share may stall one step now and then;
- the seconds per step each component spent moving state (offload and reload spans);
- whether the run stepped fused: its driver's per-step span is then ``step`` (the one call per
  step), and its stage timers (``time/generate_s``, ...) are the fused ranks' own.

Pure: reads files, imports neither Ray nor torch.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rltrain.errors import ConfigError

#: Driver spans that open a step: synchronous steps, asynchronous ones, fused ones.
STEP_SPANS = ("generate", "generate_wait", "step")
#: The driver span of a fused step.
FUSED_SPAN = "step"
#: Worker spans of state moving between device and host.
MOVE_SPANS = ("offload", "reload")


@dataclass(frozen=True)
class RunReading:
    """A run's timed steps.

    Attributes:
        steps: timed steps.
        stages: stage -> mean seconds per timed step (``time/<stage>_s``; ``step`` excluded).
        step_s: mean ``time/step_s`` (the sum of the stage timers).
        period_s: median start-to-start seconds of the timed steps; None without a trace.
        moves: ``"<component>/<offload|reload>"`` -> seconds per timed step.
        old_logprobs_s: mean seconds per timed step of the actor's pi_old forward pass
            (``actor/old_logprobs_s``; part of the ``train`` stage; 0 when it made none).
        fused: whether the driver took fused steps (its trace's per-step span is ``step``;
            False without a trace). ``step_s`` is then the driver's whole call per step.
    """

    steps: int
    stages: Mapping[str, float]
    step_s: float
    period_s: float | None = None
    moves: Mapping[str, float] = field(default_factory=dict)
    old_logprobs_s: float = 0.0
    fused: bool = False

    @property
    def seconds_per_step(self) -> float:
        """The step's real cost: the period when traced, else the stage timers' sum."""
        return self.period_s if self.period_s is not None else self.step_s

    def move_s(self, *keys: str) -> float:
        """Seconds per step of the given ``component/kind`` moves (all of them without keys)."""
        if not keys:
            return sum(self.moves.values())
        return sum(self.moves.get(k, 0.0) for k in keys)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunReading:
        return cls(
            steps=int(d["steps"]),
            stages=dict(d["stages"]),
            step_s=float(d["step_s"]),
            period_s=None if d.get("period_s") is None else float(d["period_s"]),
            moves=dict(d.get("moves", {})),
            old_logprobs_s=float(d.get("old_logprobs_s", 0.0)),
            fused=bool(d.get("fused", False)),
        )


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` records, in step order.

    Raises:
        ConfigError: when the run wrote no metrics (``logging.jsonl=false`` or it never stepped).
    """
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist: the run recorded no steps (logging.jsonl must be true)"
        ) from None
    return sorted(records, key=lambda r: r.get("step", 0))


def step_windows(trace: Any) -> tuple[list[float], list[tuple[str, str, float, float]], bool]:
    """The driver's step starts (seconds), every move span, and whether the driver stepped
    fused (its per-step span is :data:`FUSED_SPAN`), from a Chrome trace document.

    Returns:
        ``(starts, moves, fused)`` with ``moves`` as ``(component, kind, start_s, end_s)``.
    """
    from rltrain.telemetry.timeline import intervals

    starts, moves, fused = [], [], False
    for iv in intervals(trace):
        if iv.lane_kind != "process":
            continue
        if iv.component == "driver" and iv.name in STEP_SPANS:
            starts.append(iv.start_us / 1e6)
            fused = fused or iv.name == FUSED_SPAN
        elif iv.name in MOVE_SPANS:
            moves.append((iv.component, iv.name, iv.start_us / 1e6, iv.end_us / 1e6))
    return sorted(starts), moves, fused


def timed(records: Sequence[Mapping[str, Any]], warmup: int) -> list[Mapping[str, Any]]:
    """The timed records: after ``warmup`` steps, the last step left out (evaluation and the
    final checkpoint follow it) unless nothing else would remain."""
    rest = list(records[warmup:])
    return rest[:-1] if len(rest) > 1 else rest


def read_run(run_dir: str, warmup: int = 1) -> RunReading:
    """Read a finished run's timed steps (see the module docstring).

    Args:
        run_dir: the run's output directory.
        warmup: leading steps left out (start-up effects: first calls, first allocation).

    Returns:
        The reading.

    Raises:
        ConfigError: the run recorded no step past the warm-up.
    """
    records = read_metrics(run_dir)
    if len(records) <= warmup:
        raise ConfigError(
            f"{run_dir} recorded {len(records)} step(s), none after the {warmup} warm-up "
            f"step(s): profile with more steps (placement.auto.profile_steps) or a longer "
            f"placement.auto.time_limit_s"
        )
    rows = timed(records, warmup)
    keys = sorted({k for r in rows for k in r if k.startswith("time/") and k != "time/step_s"})
    stages = {k[5:-2]: statistics.fmean(float(r.get(k) or 0.0) for r in rows) for k in keys}
    step_s = statistics.fmean(float(r.get("time/step_s") or 0.0) for r in rows)
    old_lp = statistics.fmean(float(r.get("actor/old_logprobs_s") or 0.0) for r in rows)
    period, moves, fused = None, {}, False
    trace_path = os.path.join(run_dir, "trace.json")
    if os.path.exists(trace_path):
        from rltrain.telemetry.timeline import load_trace

        starts, spans, fused = step_windows(load_trace(trace_path))
        period, moves = _period_and_moves(starts, spans, warmup, len(rows))
    return RunReading(len(rows), stages, step_s, period, moves, old_lp, fused)


def _period_and_moves(
    starts: Sequence[float],
    spans: Sequence[tuple[str, str, float, float]],
    warmup: int,
    timed_steps: int,
) -> tuple[float | None, dict[str, float]]:
    """Median step period and moves per step over the timed steps' window."""
    window = list(starts[warmup : warmup + timed_steps + 1])
    if len(window) < 2:
        return None, {}
    gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
    lo, hi = window[0], window[-1]
    moves: dict[str, float] = {}
    for comp, kind, a, b in spans:
        overlap = min(b, hi) - max(a, lo)
        if overlap > 0:
            key = f"{comp}/{kind}"
            moves[key] = moves.get(key, 0.0) + overlap / len(gaps)
    return statistics.median(gaps), moves
