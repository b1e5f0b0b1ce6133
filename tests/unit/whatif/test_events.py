"""The schedules' event order and step periods on simulated devices, by hand.

Simulated devices: a generate call waits ``simulate.rollout_latency_ms``, an update
``simulate.actor_latency_ms`` (as the workers do); the calibration's runtime terms are set to
round numbers here so each period is a short sum.
"""

from __future__ import annotations

import dataclasses

import pytest

from rltrain.config.schema import RunConfig
from rltrain.whatif.calibrate import Calibration
from rltrain.whatif.events import Pipeline, Sink, simulate
from rltrain.whatif.hardware import SIM
from rltrain.whatif.workload import Proc, StepModel

CAL = Calibration(
    call_s=0.0,
    overhead_s=0.1,
    fused_overhead_s=0.05,
    sync_s=0.02,
    reward_s=0.01,
    generate_extra_s=0.0,
    decode_step_s=0.0,
    train_extra_s=0.0,
    env_item_s=0.0,
    infer_item_s=0.0,
    epoch_extra_s=0.0,
)


def _run(gen_ms=500.0, train_ms=200.0, **trainer):
    run = RunConfig()
    sim = dataclasses.replace(run.simulate, rollout_latency_ms=gen_ms, actor_latency_ms=train_ms)
    return dataclasses.replace(
        run, simulate=sim, trainer=dataclasses.replace(run.trainer, **trainer)
    )


def _procs(actor=(0,), rollout=(1,)):
    return {
        "actor": tuple(Proc("actor", i, (f"node0/dev{d}",), 0) for i, d in enumerate(actor)),
        "rollout": tuple(Proc("rollout", i, (f"node0/dev{d}",), 0) for i, d in enumerate(rollout)),
        "reward": (Proc("reward", 0, (), 0),),
    }


def _model(run, fused=False, **kw):
    procs = kw.pop("procs", None) or _procs()
    return StepModel(run, procs, SIM, SIM.intra, CAL, fused=fused, **kw)


def _periods(sink: Sink) -> list[float]:
    s = sink.step_starts
    return [b - a for a, b in zip(s, s[1:], strict=False)]


def _order(sink: Sink, step_start: float, step_end: float) -> list[tuple[str, str]]:
    """(component, span) in start order within one step, device and driver spans."""
    inside = [
        s
        for s in sink.spans
        if step_start * 1e6 - 1 <= s.start_us < step_end * 1e6 - 1 and s.dur_us > 0
    ]
    return [(s.component, s.name) for s in sorted(inside, key=lambda s: (s.start_us, s.name))]


def test_turns_runs_generate_reward_train_sync_in_order():
    m = _model(_run())
    sink = simulate(m, 3, "turns")
    sync = m.sync()
    # step 0: no weights to load; later steps load half the sync before generating
    assert _periods(sink)[0] == pytest.approx(0.5 + 0.01 + 0.2 + sync / 2 + 0.1)
    assert _periods(sink)[1] == pytest.approx(0.5 + sync / 2 + 0.01 + 0.2 + sync / 2 + 0.1)
    order = _order(sink, sink.step_starts[1], sink.step_starts[2])
    names = [n for c, n in order if c != "driver"]
    assert names == ["sync", "generate", "reward", "train", "sync"]
    assert order[0] == ("driver", "generate")  # the driver's step span opens the step


def test_fused_step_is_one_call_per_rank():
    run = _run()
    procs = {"actor": tuple(Proc("actor", i, (f"node0/dev{i}",), 0) for i in range(2))}
    m = _model(run, fused=True, procs=procs)
    sink = simulate(m, 3, "fused")
    assert _periods(sink)[1] == pytest.approx(0.5 + 0.01 + 0.2 + 0.05)
    order = [n for c, n in _order(sink, sink.step_starts[1], sink.step_starts[2]) if c != "driver"]
    assert order == ["generate"] * 2 + ["reward"] * 2 + ["train"] * 2


def test_pipelined_finish_overlaps_generation_with_learning():
    m = _model(_run(max_staleness=1, partial_rollout="finish"))
    sink = simulate(m, 8, "pipelined", staleness=1, policy="finish")
    sync = m.sync()
    # steady state: the rollout is the bottleneck: one generation (and its weight load) per step
    assert _periods(sink)[-2] == pytest.approx(0.5 + sync / 2, rel=1e-6)
    # the driver waits for the generation, it does not run it
    assert any(s.name == "generate_wait" for s in sink.spans)


def test_pipelined_restart_cancels_and_loses_the_work():
    finish = simulate(_model(_run(max_staleness=1)), 8, "pipelined", 1, "finish")
    restart = simulate(_model(_run(max_staleness=1)), 8, "pipelined", 1, "restart")
    # every generation still running at a weight swap starts over: more, shorter spans and a
    # longer period than finishing it
    gens = [s for s in restart.spans if s.component == "rollout" and s.name == "generate"]
    assert len(gens) > 8
    assert min(s.dur_us for s in gens) < 0.5e6
    assert _periods(restart)[-2] > _periods(finish)[-2]


def _tokens_run(**trainer):
    """0.1 s per generate call plus 0.1 s per decoding step, 4 tokens: a 0.5 s generation."""
    run = _run(gen_ms=100.0, train_ms=300.0, **trainer)
    sim = dataclasses.replace(run.simulate, rollout_token_latency_ms=100.0)
    return dataclasses.replace(
        run, simulate=sim, rollout=dataclasses.replace(run.rollout, max_new_tokens=4)
    )


def test_pipelined_continue_keeps_the_decoded_tokens():
    """At the swap (0.92 s) step 1's generation has run 0.42 of its 0.5 s: its 4 decoding
    steps (0.4 s) and 0.02 s of the call's latency, which the worker pays last. ``continue``
    stops it, loads the weights and makes a new call: no decoding left, its latency again
    (0.1 s) (``restart``: the whole 0.5 s)."""
    spans = {}
    for policy in ("restart", "continue"):
        sink = simulate(_model(_tokens_run(max_staleness=1)), 6, "pipelined", 1, policy)
        gens = [s for s in sink.spans if s.component == "rollout" and s.name == "generate"]
        spans[policy] = [(round(s.start_us / 1e6, 4), round(s.dur_us / 1e6, 4)) for s in gens]
        periods = _periods(sink)
        sync = _model(_tokens_run()).sync()
        if policy == "continue":  # per step: 0.42 s before the swap, the load, 0.1 s after
            assert periods[-2] == pytest.approx(0.42 + sync / 2 + 0.1, abs=1e-4)
    assert spans["restart"][1:3] == [(0.5, 0.42), (0.9301, 0.5)]
    assert spans["continue"][1:3] == [(0.5, 0.42), (0.9301, 0.1)]


def test_pipeline_refuses_nothing_queued_out_of_order():
    m = _model(_run(max_staleness=2))
    sink = Sink()
    pipe = Pipeline(m, 2, "finish", sink)
    t = pipe.step(0, 0.0, 10)
    assert [j.step for j in pipe.queue] == [1, 2]  # k generations ahead stay queued
    pipe.step(1, t, 10)
    assert [j.step for j in pipe.queue] == [2, 3]


def test_embodied_epoch_follows_the_pipeline_formula():
    run = RunConfig()
    env = dataclasses.replace(run.env, num_envs=4, pipeline_stage_num=2, rollout_steps=3)
    sim = dataclasses.replace(run.simulate, env_step_latency_ms=10, env_policy_latency_ms=20)
    run = dataclasses.replace(run, runner="embodied", env=env, simulate=sim)
    procs = {
        "env": (Proc("env", 0, (), 0),),
        "rollout": (Proc("rollout", 0, ("node0/dev1",), 0),),
        "actor": (Proc("actor", 0, ("node0/dev0",), 0),),
    }
    m = _model(run, procs=procs)
    sink = simulate(m, 2, "embodied")
    # m = 4 / (1 x 2) = 2 environments per stage: e = 20 ms, i = 40 ms; each stage is inferred
    # (from its reset observations), then stepped, 3 times. With 2 stages and one rollout rank
    # the rollout is the bottleneck (q i / S = 40 ms): RLinf's formula
    # T_crit + (N - 1) T_b = 60 + 5 x 40 = 260 ms, here the exact event order gives the same.
    epoch = sink.stage_s[0]["generate"]
    assert epoch == pytest.approx(0.26, abs=1e-9)
    first = sorted(
        (s for s in sink.spans if s.component in ("env", "rollout")), key=lambda s: s.start_us
    )
    assert first[0].name == "generate"
    step0 = next(s for s in first if s.name == "env_step")
    assert step0.start_us == pytest.approx(first[0].start_us + first[0].dur_us)
    # the second epoch opens with the rollout loading the weights the first update exported
    names = {s.name for s in sink.spans if s.component in ("env", "rollout")}
    assert names == {"env_step", "generate", "sync"}
