"""Partial rollouts (``trainer.partial_rollout``) when generation is slower than an update.

One disaggregated job (actor on device 0, rollout on device 1) drives four schedules on the
same workers: synchronous (``max_staleness=0``, the baseline) and ``max_staleness=1`` with
``finish``, ``restart`` and ``continue``. The rollout decodes at a modelled
``simulate.rollout_token_latency_ms`` per token, so a generation of ``rollout.max_new_tokens``
tokens takes about twice the modelled update (``simulate.actor_latency_ms``). With generation
``G`` slower than training ``T``, a pipelined step costs about ``G`` and a synchronous one
``G + T``; ``restart`` throws away the generation running at each swap and ``continue`` keeps it.

The extras hold, per policy, the share of sampled response tokens thrown away, the largest
staleness any trained batch had, and the share of trained tokens sampled with newer weights than
their row's first (``continue``).

Response lengths here are the tiny model's (no heavy tail is modelled): the measure compares the
policies at a fixed generation/update ratio.

``--quick`` (CI) checks the path, not the figures: 3 steps per call on the job the schedule
measures share in one bench process (:func:`~rltrain.bench.measures.trainer.quick_schedules_job`:
``long_tail``'s quick shape, modelled lengths included), not this measure's own.
"""

from __future__ import annotations

import contextlib
from typing import Any

from rltrain.bench.harness import Suite, measure
from rltrain.bench.measures.trainer import SCHEDULES

TOKEN_MS = 250.0  # x max_new_tokens = 8: a generation takes up to 2 s
ACTOR_MS = 1000.0
POLICIES = ("finish", "restart", "continue")


@measure(
    "partial_rollout",
    "max_staleness=1 finish / restart / continue vs synchronous when generation is 2x an update",
    share=SCHEDULES,
)
def partial_rollout(quick: bool) -> Suite:
    from rltrain.bench.measures.trainer import (
        SCHEDULES_BASE,
        compose,
        policy_cases,
        quick_schedules_job,
        quick_schedules_shape,
        start_reasoning,
    )

    steps = 3 if quick else 6
    stack = contextlib.ExitStack()
    if quick:  # the schedule measures' shared job
        _, job, first = quick_schedules_job()
        shape = quick_schedules_shape()
    else:
        run = compose(
            *SCHEDULES_BASE,
            f"simulate.rollout_token_latency_ms={TOKEN_MS}",
            f"simulate.actor_latency_ms={ACTOR_MS}",
            "trainer.train_batch_size=2",
            "rollout.n_samples_per_prompt=4",
            "rollout.max_new_tokens=8",
        )
        job, first = start_reasoning(run, stack), 0
        shape = (
            f"{TOKEN_MS:.0f} ms per decoded token (up to 8 per response), {ACTOR_MS:.0f} ms "
            f"per update; tiny-model response lengths"
        )
    threads = job.groups["actor"].reservation.layout.slot("actor", 0).num_threads
    cases, seen = policy_cases(job, steps, POLICIES, first_step=first)
    return Suite(
        cases=cases,
        baseline=cases[0].name,
        warmup=0 if quick else 1,  # --quick checks the path: the timed call is the first
        repeats=3,
        note=f"speed-up = 1/ratio. {shape}; simulated devices, one job for every "
        f"schedule, {threads} torch thread(s) per process.",
        teardown=stack.close,
        extras=lambda: extras({n: [r for _, r in calls] for n, calls in seen.items()}),
    )


def extras(seen: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Per policy: discarded share of sampled tokens, largest staleness, continued share.

    Args:
        seen: each schedule's step records (warm-up and timed calls).

    Returns:
        ``<policy>_discarded_share``, ``<policy>_staleness_max`` and
        ``<policy>_continued_share`` for each pipelined policy.
    """
    out: dict[str, float] = {}
    for name, records in seen.items():
        if name == "sync" or not records:
            continue
        trained = sum(r["perf/tokens_per_s"] * r["time/step_s"] for r in records)
        discarded = sum(r.get("rollout/discarded_tokens", 0) for r in records)
        continued = sum(r.get("rollout/continued_tokens", 0) for r in records)
        out[f"{name}_discarded_share"] = discarded / (trained + discarded) if trained else 0.0
        out[f"{name}_staleness_max"] = max(r["rollout/staleness_max"] for r in records)
        out[f"{name}_continued_share"] = continued / trained if trained else 0.0
    return out
