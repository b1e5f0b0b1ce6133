"""Long-tail generation: heavy-tailed response lengths, synchronous vs partial rollouts.

One disaggregated job (actor on device 0, rollout on device 1) drives six schedules on the
same workers: synchronous (``max_staleness=0``, the baseline), ``max_staleness=1`` with
``finish``, ``restart`` and ``continue``, ``fifo`` (``max_staleness=1``, ``finish`` with
``trainer.sampler=fifo``: two generations in flight, each step trains the freshest complete
one), ``carry`` with ``max_staleness=2`` (a row carried into the next call trains 2
versions after it started; docs/async.md#carry), and ``carry7``: ``carry`` with
``max_staleness=7``, ``trainer.carry_surplus=2`` and ``trainer.carry_segment=1``, the setting
the idle goal needs (docs/async.md#benchmark-heavy-tailed-response-lengths). The rollout's
device time follows heavy-tailed response lengths (``simulate.response_length_median``:
log-normal, sigma 1, capped at 16x the median, drawn per step and rank): a generate call waits
``simulate.rollout_token_latency_ms`` per decoding step of its longest modelled row, so a few
long rows set every call's time (with ``carry``, per decoding step of its carry buffer).

Generation-bound by default: an update takes 250 ms, a quarter of a static batch's decoding
(about 40 steps of 25 ms), the regime the long tail is about. ``RLTRAIN_BENCH_LONG_TAIL_ACTOR_MS``
sets another update time for every schedule alike (1000: balanced, where an overlapped
schedule that generates faster than an update waits for the actor, so its speed-up over
``finish`` cannot show).

The extras hold, per schedule, the steps per second (from the step records of the timed
calls, the warm-up call left out), the idle share of the generation slots, the share of sampled
tokens thrown away and the largest staleness; then each goal of issue 33 with its value and
``_met`` (1 or 0).

Idle share of the generation slots: ``1 - (sum over the trained steps of the modelled
row-decoding seconds, token latency x mean modelled length) / (sum of the steps' seconds)``.
A static batch decodes until its longest row ends, so its finished rows idle meanwhile; a
synchronous loop also idles the rollout while the actor trains.

Idle share while the rollout decodes (``_rollout_idle``): the slots idle during the decoding
itself, the rollout's waits for the actor left out: ``1 - sum(mean length) / sum(longest
length)`` over the trained steps' draws for a static batch, and ``1 - busy / slot_steps`` of
the rollout's carry buffer (:meth:`RolloutWorker.carry_stats`, the schedule's whole run) for
``carry`` and ``carry7``.

``--quick`` (CI) checks the path, not the figures: 2 steps per call at a twentieth of the
latencies, on the job the schedule measures share in one bench process
(:func:`~rltrain.bench.measures.trainer.quick_schedules_job`: this shape, the update time fixed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

from rltrain.bench.harness import Suite, measure
from rltrain.bench.measures.trainer import SCHEDULES

TOKEN_MS = 25.0  # per modelled decoding step: a call of 8 rows takes ~1 s on average
MEDIAN = 8.0  # modelled tokens; the longest of 8 rows averages ~40
ACTOR_MS = 250.0  # per update: generation-bound (a static batch decodes ~1 s)
#: ``--quick``: the share of the latencies (the schedule measures' shared job has this shape).
QUICK_SCALE = 0.05
#: Environment variable setting another update time (ms) for every schedule.
ACTOR_ENV = "RLTRAIN_BENCH_LONG_TAIL_ACTOR_MS"
POLICIES = ("finish", "restart", "continue", "fifo", "carry", "carry7")
STALENESS = {"carry": 2, "carry7": 7}  # the others run with max_staleness=1
SAMPLERS = {"fifo": "fifo"}  # finish with trainer.sampler=fifo
#: carry schedules: trainer.carry_surplus / carry_segment (carry: the config's, 1 and 4)
CARRY: dict[str, dict[str, int]] = {"carry": {}, "carry7": {"surplus": 2, "segment": 1}}
ROWS = 8  # train_batch_size 2 x 4 samples, on the one rollout rank

#: The goals of issue 33 on these devices: (key, what, bound, "<=" or ">=").
GOALS: tuple[tuple[str, str, float, str], ...] = (
    ("sync_idle", "synchronous generation-slot idle share", 0.5, ">="),
    *(
        goal
        for p in ("continue", *CARRY)
        for goal in (
            (f"{p}_idle", f"{p}: generation-slot idle share over the step", 0.10, "<="),
            (f"{p}_rollout_idle", f"{p}: slot idle share while the rollout decodes", 0.10, "<="),
            (f"{p}_speedup_vs_sync", f"{p}: steps/s vs synchronous", 2.0, ">="),
            (f"{p}_speedup_vs_best", f"{p}: steps/s vs the best of finish/restart", 1.3, ">="),
            (f"{p}_discarded_share", f"{p}: sampled tokens thrown away", 0.05, "<="),
        )
    ),
    ("within_bound", "share of trained batches within their max_staleness", 1.0, ">="),
)


@measure(
    "long_tail",
    "heavy-tailed response lengths: max_staleness=1 finish / restart / continue / fifo "
    "sampler, max_staleness=2 carry and max_staleness=7 carry (surplus 2, segment 1) vs "
    "synchronous",
    share=SCHEDULES,
)
def long_tail(quick: bool) -> Suite:
    from rltrain.bench.measures.trainer import (
        SCHEDULES_BASE,
        compose,
        policy_cases,
        quick_schedules_job,
        start_reasoning,
    )

    steps = 2 if quick else 8
    scale = QUICK_SCALE if quick else 1.0  # --quick (CI) checks the path, not the figures
    # --quick: the shared job's update time (QUICK_SCHEDULES_RUN), the variable ignored
    actor_ms = ACTOR_MS if quick else actor_latency_ms()
    stack = contextlib.ExitStack()
    if quick:  # the schedule measures' shared job (this shape)
        run, job, first = quick_schedules_job()
    else:
        run = compose(
            *SCHEDULES_BASE,
            f"simulate.rollout_token_latency_ms={TOKEN_MS * scale}",
            f"simulate.response_length_median={MEDIAN}",
            f"simulate.actor_latency_ms={actor_ms * scale}",
            "trainer.train_batch_size=2",
            "rollout.n_samples_per_prompt=4",
            "rollout.max_new_tokens=8",
        )
        job, first = start_reasoning(run, stack), 0
    cases, seen = policy_cases(job, steps, POLICIES, STALENESS, SAMPLERS, CARRY, first)
    token_s = TOKEN_MS * scale / 1000
    kept = CarryStats(lambda: carry_stats(job))

    def figures() -> dict[str, float]:
        timed = {n: p[steps:] for n, p in seen.items()}
        out = extras(
            timed, lambda s: busy_s(run.seed, s, token_s), spread=lambda s: spread(run.seed, s)
        )
        kept.close()
        idle = {k: v for name in CARRY for k, v in carry_idle(kept.of(name), name).items()}
        return report({**out, **idle})

    return Suite(
        cases=tuple(
            kept.track(c, name) for c, name in zip(cases, ("sync", *POLICIES), strict=True)
        ),
        baseline=cases[0].name,
        warmup=1,
        repeats=3,
        note=f"speed-up = 1/ratio. {TOKEN_MS * scale:g} ms per modelled decoding step, modelled "
        f"lengths log-normal (median {MEDIAN:g} tokens, sigma 1, cap {16 * MEDIAN:g}), "
        f"{actor_ms * scale:g} ms per update; simulated devices, one job for every schedule; "
        f"carry runs with max_staleness=2, carry7 with 7 (trainer.carry_surplus=2, "
        f"trainer.carry_segment=1), the others with 1; fifo is finish with trainer.sampler=fifo.",
        teardown=stack.close,
        extras=figures,
    )


def actor_latency_ms(env: Mapping[str, str] | None = None) -> float:
    """The update time of every schedule: :data:`ACTOR_ENV` if set, else :data:`ACTOR_MS`.

    Raises:
        ConfigError: the variable is not a number above 0.
    """
    from rltrain.errors import ConfigError

    raw = (os.environ if env is None else env).get(ACTOR_ENV, "")
    if not raw:
        return ACTOR_MS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise ConfigError(
            f"{ACTOR_ENV}={raw!r} is not valid: give the update time in ms, above 0 "
            f"(unset: {ACTOR_MS:g})"
        )
    return value


def carry_stats(job: Any) -> list[dict[str, int]]:
    """Each rollout rank's carry totals (:meth:`RolloutWorker.carry_stats`)."""
    from rltrain.workers.rollout import RolloutWorker

    return list(job.groups["rollout"].call(RolloutWorker.carry_stats).wait())


class CarryStats:
    """Each carry schedule's buffer totals. The schedules share the rollout workers, and a
    schedule's prime starts a new buffer there, so a schedule's totals are read before the
    next case's first call (untimed: its warm-up) and, for the last, at the end.

    Args:
        read: the rollout ranks' totals now (:func:`carry_stats`).
    """

    def __init__(self, read: Any) -> None:
        self.read = read
        self.stats: dict[str, Any] = {}
        self._open: str | None = None

    def track(self, case: Any, name: str) -> Any:
        """``case`` with its calls noted: its first reads the previous carry schedule's."""
        first = [True]

        def fn() -> Any:
            if first[0]:
                first[0] = False
                self.close()
            self._open = name if name in CARRY else None
            return case.fn()

        return dataclasses.replace(case, fn=fn)

    def close(self) -> None:
        """Read the totals of the carry schedule that ran last, if any."""
        if self._open is not None:
            self.stats[self._open] = self.read()
            self._open = None

    def of(self, name: str) -> Sequence[Mapping[str, int]]:
        """The totals read for carry schedule ``name`` (empty: none)."""
        return self.stats.get(name, [])


def carry_idle(stats: Sequence[Mapping[str, int]], name: str = "carry") -> dict[str, float]:
    """``<name>_rollout_idle``: the share of slot-steps no row decoded, over the ranks."""
    slots = sum(s.get("slot_steps", 0) for s in stats)
    if not slots:
        return {}
    return {f"{name}_rollout_idle": 1 - sum(s["busy"] for s in stats) / slots}


def _drawn(seed: int, step: int) -> list[int]:
    """The modelled lengths the worker draws for a step's rows on rank 0."""
    from rltrain.config.seeds import sampling_seed
    from rltrain.whatif.lengths import simulated

    return simulated(MEDIAN).sample(random.Random(sampling_seed(seed, step, 0)), ROWS)


def spread(seed: int, step: int) -> tuple[float, float]:
    """``(mean, longest)`` of a step's modelled lengths: a static batch keeps its slots for the
    longest, and its rows decode the mean."""
    drawn = _drawn(seed, step)
    return sum(drawn) / len(drawn), max(drawn)


def busy_s(seed: int, step: int, token_s: float) -> float:
    """The modelled row-decoding seconds of a step's generation: token latency x the mean of
    its rows' modelled lengths (what the worker draws for the step on rank 0)."""
    drawn = _drawn(seed, step)
    return token_s * sum(drawn) / len(drawn)


def extras(
    seen: Mapping[str, Sequence[tuple[int, Mapping[str, Any]]]],
    busy: Any,
    k: int = 1,
    spread: Any = None,
) -> dict[str, float]:
    """Per schedule: steps/s, generation-slot idle share, discarded share, largest staleness;
    then the goals' values (:data:`GOALS`).

    Args:
        seen: each schedule's ``(step, step record)`` pairs (of the timed calls).
        busy: ``step -> seconds`` of modelled row decoding of that step's batch.
        k: the pipelined schedules' ``max_staleness`` (the carry ones': :data:`STALENESS`).
        spread: ``step -> (mean, longest)`` modelled length of its rows, for the static
            batches' ``<name>_rollout_idle`` (None: not computed).

    Returns:
        ``<name>_steps_per_s``, ``<name>_idle``, ``<name>_rollout_idle`` (static batches), and
        for the pipelined schedules ``<name>_discarded_share``, ``<name>_dropped_samples``
        (samples past the bound or, with ``fifo``, older than the freshest) and
        ``<name>_staleness_max``; then each goal's key.
    """
    out: dict[str, float] = {}
    within = total = 0
    for name, pairs in seen.items():
        if not pairs:
            continue
        wall = sum(r["time/step_s"] for _, r in pairs)
        out[f"{name}_steps_per_s"] = len(pairs) / wall
        out[f"{name}_idle"] = 1 - sum(busy(s) for s, _ in pairs) / wall
        if spread is not None and name not in CARRY:
            drawn = [spread(s) for s, _ in pairs]
            out[f"{name}_rollout_idle"] = 1 - sum(m for m, _ in drawn) / sum(x for _, x in drawn)
        if name == "sync":
            continue
        trained = sum(r["perf/tokens_per_s"] * r["time/step_s"] for _, r in pairs)
        discarded = sum(r.get("rollout/discarded_tokens", 0) for _, r in pairs)
        out[f"{name}_discarded_share"] = discarded / (trained + discarded) if trained else 0.0
        out[f"{name}_dropped_samples"] = sum(r.get("rollout/dropped_samples", 0) for _, r in pairs)
        out[f"{name}_staleness_max"] = max(r["rollout/staleness_max"] for _, r in pairs)
        bound = STALENESS.get(name, k)
        within += sum(r["rollout/staleness_max"] <= bound for _, r in pairs)
        total += len(pairs)
    best = max(out.get(f"{p}_steps_per_s", 0.0) for p in ("finish", "restart"))
    for p in ("continue", *CARRY):
        if "sync_steps_per_s" in out and f"{p}_steps_per_s" in out:
            rate = out[f"{p}_steps_per_s"]
            out[f"{p}_speedup_vs_sync"] = rate / out["sync_steps_per_s"]
            out[f"{p}_speedup_vs_best"] = rate / best if best else math.nan
    if total:
        out["within_bound"] = within / total
    return out


def report(figures: dict[str, float]) -> dict[str, float]:
    """Print each goal with its value and whether it is met; add ``<goal>_met`` (1 or 0)."""
    out = dict(figures)
    for key, what, bound, way in GOALS:
        value = figures.get(key, math.nan)
        met = value >= bound if way == ">=" else value <= bound
        out[f"{key}_met"] = float(met)
        print(f"goal {what} {way} {bound:g}: {value:.3g} -> {'met' if met else 'NOT met'}")
    print("goal steps to 0.9 greedy accuracy <= 1.1x synchronous: not measured (docs/async.md)")
    return out
