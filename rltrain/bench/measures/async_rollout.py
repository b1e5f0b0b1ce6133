"""Asynchronous rollout (``trainer.max_staleness=1``) against the synchronous loop, same job.

Disaggregated placement (actor on device 0, rollout on device 1). The latency knobs make each
stage take a fixed time per step (``simulate.rollout_latency_ms`` per generate call,
``simulate.actor_latency_ms`` per train call) with a batch so small that compute is a few ms,
balanced: the synchronous loop
pays ``G + T`` per step, the pipelined one ``max(G, T)`` plus what cannot overlap (reward,
weight export, Ray calls). The ideal ratio is 2x; goal >= 1.8x.

Both schedules drive the same started job (same workers, same devices): only the runner's
``max_staleness`` differs, so start-up cost and placement are out of the ratio. The pipelined
case ends each timed section by waiting for the generation it submitted ahead, so it pays for
that work itself and leaves the rollout idle for the next section.

``--quick`` (CI) checks the path, not the ratio: 3 steps per call on the job the schedule
measures share in one bench process (:func:`~rltrain.bench.measures.trainer.quick_schedules_job`:
``long_tail``'s quick shape, modelled per-token latencies), not this measure's own.
"""

from __future__ import annotations

import contextlib

from rltrain.bench.harness import Case, Suite, measure
from rltrain.bench.measures.trainer import SCHEDULES

# Long enough that the stages' real compute and the Ray calls (a few ms on a quiet machine,
# 0.2-0.4 s per step when the 2 shared cores are saturated) stay small next to it: this measures
# the schedule.
LATENCY_MS = 2000.0


@measure(
    "async_rollout",
    "disaggregated, max_staleness=1 vs synchronous: steps/s (goal >= 1.8x)",
    share=SCHEDULES,
)
def async_rollout(quick: bool) -> Suite:
    from rltrain.bench.measures.trainer import (
        SCHEDULES_BASE,
        compose,
        quick_schedules_job,
        quick_schedules_shape,
        start_reasoning,
    )
    from rltrain.runners.reasoning import ReasoningRunner

    steps = 3 if quick else 6
    stack = contextlib.ExitStack()
    if quick:  # the schedule measures' shared job
        _, job, base = quick_schedules_job()
        shape = quick_schedules_shape()
    else:
        # trainer.max_staleness=1 in the config (each runner below still picks its own
        # schedule): the job's thread rule then counts actor and rollout together, one core
        # each, as any asynchronous run gets. Both schedules share that setting; the
        # synchronous one is not slower with it (tiny batches gain nothing from a second
        # thread).
        run = compose(
            *SCHEDULES_BASE,
            f"simulate.rollout_latency_ms={LATENCY_MS}",
            f"simulate.actor_latency_ms={LATENCY_MS}",
            "trainer.train_batch_size=2",
            "rollout.n_samples_per_prompt=2",
            "rollout.max_new_tokens=1",
        )
        job, base = start_reasoning(run, stack), 0
        shape = f"{LATENCY_MS:.0f} ms per stage per step, balanced"
    threads = job.groups["actor"].reservation.layout.slot("actor", 0).num_threads
    runners = {k: ReasoningRunner(job, max_staleness=k) for k in (0, 1)}
    # Disjoint step (hence weight version) ranges: the rollout reloads weights at every step of
    # either schedule, as in a real run, instead of mistaking one runner's version for the other's.
    first = {0: base, 1: base + 10**6}
    counters = {k: iter(range(first[k], first[k] + 10**6)) for k in runners}
    for k, runner in runners.items():
        runner.schedule.begin(first[k], None)
    worst = {"staleness": 0}

    def steps_of(k: int):
        def run_steps() -> None:
            runner = runners[k]
            for _ in range(steps):
                record = runner.train_step(next(counters[k]))
                worst["staleness"] = max(worst["staleness"], record.get("rollout/staleness", 0))
            runner.schedule.drain()
            if worst["staleness"] > 1:
                raise RuntimeError(f"staleness {worst['staleness']} exceeded max_staleness=1")

        return run_steps

    sync_name = f"{steps} synchronous steps (max_staleness=0)"
    return Suite(
        cases=(
            Case(sync_name, steps_of(0), work=steps, work_unit="steps"),
            Case(
                f"{steps} pipelined steps (max_staleness=1)",
                steps_of(1),
                work=steps,
                work_unit="steps",
            ),
        ),
        baseline=sync_name,
        warmup=0 if quick else 1,  # --quick checks the path: the timed call is the first
        repeats=5,
        note=f"speed-up = 1/ratio; goal >= 1.8x (ideal 2x). {shape}; simulated devices, actor "
        "on device 0, rollout on device 1, one job for both schedules, "
        f"{threads} torch thread(s) per process.",
        teardown=stack.close,
    )
