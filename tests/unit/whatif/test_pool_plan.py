"""The what-if simulator's ``trainer.sampler=fifo|windowed`` schedule (:class:`PoolPipeline`): it
runs the runtime's own choice of shards (:func:`rltrain.whatif.samplers.choose`), so
``mode=plan`` predicts a pooled run instead of refusing it. Device time only: no host terms."""

from __future__ import annotations

import dataclasses

import pytest

from rltrain.config.schema import RunConfig
from rltrain.whatif.calibrate import Calibration
from rltrain.whatif.events import PoolPipeline, Sink, simulate, unmodelled
from rltrain.whatif.hardware import SIM
from rltrain.whatif.workload import Proc, StepModel

CAL = Calibration(
    call_s=0.0,
    overhead_s=0.0,
    generate_extra_s=0.0,
    decode_step_s=0.0,
    sync_s=0.0,
    reward_s=0.0,
    train_extra_s=0.0,
)


def _model(gen_ms: float, train_ms: float, sampler: str, k: int = 2, window=None) -> StepModel:
    run = RunConfig()
    run = dataclasses.replace(
        run,
        simulate=dataclasses.replace(
            run.simulate, rollout_latency_ms=gen_ms, actor_latency_ms=train_ms
        ),
        trainer=dataclasses.replace(
            run.trainer, max_staleness=k, sampler=sampler, sampler_window=window
        ),
    )
    procs = {
        "actor": (Proc("actor", 0, ("node0/dev0",), 0),),
        "rollout": (Proc("rollout", 0, ("node0/dev1",), 0),),
    }
    return StepModel(run, procs, SIM, SIM.intra, CAL)


def _periods(m: StepModel, steps: int, sampler: str) -> list[float]:
    k = int(m.run.trainer.max_staleness)
    s = simulate(m, steps, "pipelined", k, "finish", sampler).step_starts
    return [round(b - a, 6) for a, b in zip(s, s[1:], strict=False)]


def test_fifo_runs_like_in_order_when_generation_is_the_bottleneck():
    """0.5 s generations, 0.2 s updates: every step waits for the oldest generation; both take
    one generation per step (the first waits for the first generation and its update)."""
    m = _model(500, 200, "fifo")
    assert _periods(m, 8, "fifo")[1:] == pytest.approx([0.5] * 7, abs=1e-3)
    assert _periods(_model(500, 200, "in_order"), 8, "in_order")[1:] == pytest.approx(
        [0.5] * 7, abs=1e-3
    )


def test_a_window_of_one_version_waits_for_a_generation_sent_after_the_update():
    """Train-heavy (0.2 s generations, 0.5 s updates), ``windowed`` with W = 1: only shards
    sampled with the actor's own weights train, and the generations sent before the update are
    dropped: each step is a 0.2 s generation then the 0.5 s update (fifo overlaps them)."""
    windowed = _periods(_model(200, 500, "windowed", window=1), 8, "windowed")
    assert windowed[1:-1] == pytest.approx([0.7] * 6, abs=1e-3)
    fifo = _periods(_model(200, 500, "fifo"), 8, "fifo")
    assert fifo[1:-1] == pytest.approx([0.5] * 6, abs=1e-3)


def test_aged_shards_are_dropped_and_counted():
    m = _model(200, 500, "windowed", window=1)
    pipe = PoolPipeline(m, 2, "finish", Sink(), limit=0)
    t = 0.0
    for s in range(6):
        t = pipe.step(s, t, 6)
    assert pipe.dropped > 0
    assert all(6 - p.version <= 1 for p in pipe.pool)  # what stays pooled is recent


def test_plan_no_longer_refuses_the_samplers():
    run = RunConfig()
    run.trainer.max_staleness = 2
    run.trainer.sampler = "fifo"
    assert unmodelled(run) == []
    run.rollout.dispatch = "length_aware"
    assert unmodelled(run) == []  # simulated devices: predicted as in_order
