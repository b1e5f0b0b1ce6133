"""The summary's rates share one time base, by hand: ``steps_per_s`` and ``tokens_per_s`` are
both over ``wall_s`` (the training loop's seconds, the reward curve's drawing not in them), so
their ratio is the tokens generated per step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from fit_stubs import StubRunner, StubSchedule

from rltrain.config.schema import RunConfig
from rltrain.runners import loop
from rltrain.runners.reasoning import ReasoningRunner
from rltrain.telemetry.summary import across_attempts, generated_tokens

# two steps: 477 tokens in 0.084 s, 523 tokens in 0.1 s (rates over each step's own time)
RECORDS = [
    {"step": 0, "perf/tokens_per_s": 477 / 0.084, "time/step_s": 0.084},
    {"step": 1, "perf/tokens_per_s": 5230.0, "time/step_s": 0.1},
]


def test_generated_tokens_are_each_steps_rate_times_its_time():
    assert generated_tokens(RECORDS) == 1000
    # a step without its time (or its rate) adds none
    assert generated_tokens([{"perf/tokens_per_s": 10.0}, {"time/step_s": 1.0}]) == 0
    assert generated_tokens([]) == 0


def _runner() -> Any:
    nodes = [SimpleNamespace(accelerator_type="sim")]
    plan = SimpleNamespace(
        mode=SimpleNamespace(value="collocated"), cluster=SimpleNamespace(nodes=nodes)
    )
    job = SimpleNamespace(plan=plan, residency=SimpleNamespace(peak={}))
    return SimpleNamespace(job=job, run=RunConfig(), schedule=SimpleNamespace())


def test_reasoning_summary_rates_are_over_the_same_seconds():
    # 2 steps and 1000 tokens in 0.5 s of training loop (an evaluation and a checkpoint
    # included): 4 steps/s and 2000 tokens/s, 500 tokens per step as generated
    out = ReasoningRunner.summary(_runner(), RECORDS, 2, 0.5, "completed")
    assert out["wall_s"] == 0.5
    assert out["steps_per_s"] == pytest.approx(4.0)
    assert out["tokens_per_s"] == pytest.approx(2000.0)
    assert out["tokens_per_s"] / out["steps_per_s"] == pytest.approx(500.0)
    assert ReasoningRunner.summary(_runner(), [], 0, 0.0, "completed")["tokens_per_s"] is None


def test_across_attempts_tokens_per_s_is_over_every_attempts_seconds():
    # 4 steps of 100 tokens each (200 tokens/s over 0.5 s); attempts trained 3 s + 1 s
    records = [{"step": s, "perf/tokens_per_s": 200.0, "time/step_s": 0.5} for s in range(4)]
    attempts = [
        {"first_step": 0, "done_steps": 3, "training_s": 3.0},
        {"first_step": 2, "done_steps": 4, "training_s": 1.0},
    ]
    out = across_attempts({"steps": 2, "tokens_per_s": 999.0}, records, attempts)
    assert out["wall_s"] == 4.0 and out["steps_per_s"] == 1.0
    assert out["tokens_per_s"] == 100.0  # 400 tokens over 4 s: 100 tokens per step


def test_across_attempts_keeps_the_runners_stages():
    # an embodied run restarted once: env_step and infer are parts of generate, not stages
    step = {"time/generate_s": 1.0, "time/env_step_s": 0.6, "time/infer_s": 0.3}
    step |= {"time/train_s": 0.5, "time/sync_s": 0.1, "time/step_s": 1.6}
    records = [{"step": s, **step} for s in range(2)]
    attempts = [
        {"first_step": 0, "done_steps": 1, "training_s": 1.6},
        {"first_step": 1, "done_steps": 2, "training_s": 1.6},
    ]
    last = {"seconds_per_stage": {"generate": 1.0, "train": 0.5, "sync": 0.1}}
    out = across_attempts(last, records, attempts)
    assert out["seconds_per_stage"] == {
        "generate": pytest.approx(1.0),
        "train": pytest.approx(0.5),
        "sync": pytest.approx(0.1),
    }
    assert sum(out["seconds_per_stage"].values()) == pytest.approx(1.6)


class _Clock:
    """Stands in for ``time`` in the loop: a step takes 1 s, drawing the curve 10 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_fit_times_the_steps_without_the_reward_curve(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(loop, "time", clock)

    def slow_plot(records: list[dict], path: str) -> None:
        clock.now += 10.0

    monkeypatch.setattr(loop, "plot_curves", slow_plot)
    run = RunConfig()
    run.trainer.total_steps, run.trainer.eval_every = 2, 0
    run.logging.progress = False

    summary = loop.fit(StubRunner(), StubSchedule(clock=clock), run, str(tmp_path))

    assert summary["steps"] == 2 and summary["seconds"] == 2.0
    assert loop.last_fit() == loop.Progress(0, 2, 2.0)  # the restarts' time base too
