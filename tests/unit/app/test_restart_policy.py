"""``trainer.max_restarts`` spends restarts on failures a restart can cure only.

The job itself is replaced by a stand-in that fails as a worker would (a ``WorkerError`` with
the worker's exception as its cause, after the loop recorded how far it got); the restart
policy, the restart records and the summary are rltrain's own. The real faults, injected into
a real run, are in tests/integration/reliability/test_restarts.py.
"""

from __future__ import annotations

import pytest
from test_front_door import compose_config

from rltrain import app
from rltrain.config import load_config
from rltrain.errors import ConfigError, WorkerError
from rltrain.runners import loop
from rltrain.telemetry.summary import across_attempts


def failure(cause: BaseException | None, text: str = "worker failed") -> WorkerError:
    err = WorkerError(f"group 'actor' rank 0 (node 0, pid 1234): 'train' raised:\n{text}")
    err.cause = cause
    err.where = "group 'actor' rank 0 'train'"
    return err


def attempts_of(monkeypatch, tmp_path, outcomes, *overrides: str):
    """Run app.train over ``outcomes`` (an exception to raise, or a summary to return), each
    attempt having reached ``done`` steps; returns the number of attempts made."""
    calls = []

    def attempt(run, out_dir, layout):
        outcome, done = outcomes[len(calls)]
        calls.append(run.trainer.resume)
        loop.LAST_FIT[:] = [loop.Progress(0, done, 2.0 * done)]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(app, "_train_once", attempt)
    run = load_config(compose_config("trainer.max_restarts=3", *overrides))
    return calls, run


@pytest.mark.parametrize(
    "cause",
    [ConfigError("actor.something=1 is wrong"), TypeError("unsupported operand")],
    ids=["ConfigError", "TypeError"],
)
def test_a_deterministic_error_ends_the_run_without_restarting(monkeypatch, tmp_path, cause):
    calls, run = attempts_of(monkeypatch, tmp_path, [(failure(cause), 3)] * 4)
    with pytest.raises(WorkerError) as info:
        app.train(run, str(tmp_path))
    assert len(calls) == 1
    text = str(info.value)
    assert "not restarting" in text and type(cause).__name__ in text
    assert "trainer.max_restarts=3" in text


def test_the_same_error_at_the_same_step_twice_ends_the_run(monkeypatch, tmp_path):
    died = failure(None, "the worker process died while running 'train'")
    calls, run = attempts_of(monkeypatch, tmp_path, [(died, 5), (died, 5), (died, 5)])
    with pytest.raises(WorkerError, match="same failure happened at step 5 twice"):
        app.train(run, str(tmp_path))
    assert len(calls) == 2


def test_a_transient_failure_is_restarted_and_the_summary_covers_every_attempt(
    monkeypatch, tmp_path
):
    died = failure(None, "the worker process died while running 'train'")
    done = {"status": "completed", "steps": 6, "wall_s": 12.0, "steps_per_s": 0.5}
    calls, run = attempts_of(monkeypatch, tmp_path, [(died, 4), (died, 7), (done, 10)])
    summary = app.train(run, str(tmp_path))
    assert len(calls) == 3 and len(summary["restarts"]) == 2
    assert [a["status"] for a in summary["attempts"]] == ["failed", "failed", "completed"]
    assert summary["steps"] == 10  # the run's steps, not the last attempt's 6
    assert summary["wall_s"] == pytest.approx(2.0 * (4 + 7 + 10))  # every attempt's training


def test_the_restart_records_name_the_exception_type_and_message(monkeypatch, tmp_path):
    outage = failure(RuntimeError("transient reward outage"), "Traceback ...")
    outage.where = "group 'reward' rank 0 'score' (an input of group 'actor' rank 0 'train')"
    done = {"status": "completed", "steps": 2, "wall_s": 4.0, "steps_per_s": 0.5}
    _, run = attempts_of(monkeypatch, tmp_path, [(outage, 2), (done, 4)])
    summary = app.train(run, str(tmp_path))
    expected = f"RuntimeError: transient reward outage in {outage.where}"
    assert summary["restarts"][0]["cause"] == expected
    assert summary["attempts"][0]["cause"] == expected


def test_across_attempts_recomputes_the_per_step_measures():
    last = {"steps": 2, "wall_s": 1.0, "steps_per_s": 2.0, "seconds_per_stage": {"train": 9.0}}
    records = [
        {"step": s, "time/train_s": 0.5, "time/step_s": 0.5, "perf/tokens_per_s": 100.0}
        for s in range(4)
    ]
    attempts = [
        {"first_step": 0, "done_steps": 3, "training_s": 3.0},
        {"first_step": 2, "done_steps": 4, "training_s": 1.0},
    ]
    out = across_attempts(last, records, attempts)
    assert out["steps"] == 4 and out["wall_s"] == 4.0 and out["steps_per_s"] == 1.0
    assert out["seconds_per_stage"] == {"train": 0.5}
    assert out["tokens_per_s"] == 50.0  # 4 steps x 50 tokens over the 4 training seconds


def test_across_attempts_totals_the_rollout_over_the_steps_every_attempt_kept():
    # Attempt 1 ran steps 0-4 and failed in step 4; the restart resumed from the step-4
    # checkpoint and redid step 4 (metrics.jsonl holds the redone record only), then step 5.
    continued, discarded, dropped = [0, 100, 50, 30, 20, 10], [0, 5, 0, 0, 7, 0], [0, 0, 1, 0, 0, 2]
    stale = [0, 1, 1, 2, 1, 0]
    records = [
        {
            "step": s,
            "rollout/continued_tokens": continued[s],
            "rollout/discarded_tokens": discarded[s],
            "rollout/dropped_samples": dropped[s],
            "rollout/staleness_max": stale[s],
        }
        for s in range(6)
    ]
    # The final attempt's own totals (steps 4-5) with 1 group of 9 tokens left buffered.
    final = {
        "staleness_max": 1,
        "continued_tokens": 30,
        "discarded_tokens": 7 + 9,
        "dropped_samples": 2,
        "unfinished_groups": 1,
        "within_bound": 1.0,
    }
    last = {"steps": 2, "wall_s": 2.0, "steps_per_s": 1.0, "rollout": final}
    attempts = [
        {"first_step": 0, "done_steps": 4, "training_s": 4.0},
        {"first_step": 4, "done_steps": 6, "training_s": 2.0},
    ]
    out = across_attempts(last, records, attempts, max_staleness=1)
    assert out["rollout"] == {
        "staleness_max": 2,
        "continued_tokens": 210,  # 0 + 100 + 50 + 30 kept from attempt 1, + 20 + 10
        "discarded_tokens": 5 + 16,
        "dropped_samples": 1 + 2,
        "unfinished_groups": 1,
        "within_bound": pytest.approx((3 + 2) / 6),  # steps 0-2 and 4-5 within 1 version
    }


def test_across_attempts_leaves_a_synchronous_run_without_rollout_totals():
    records = [{"step": s, "time/train_s": 0.5} for s in range(3)]
    attempts = [
        {"first_step": 0, "done_steps": 2, "training_s": 2.0},
        {"first_step": 2, "done_steps": 3, "training_s": 1.0},
    ]
    assert "rollout" not in across_attempts({"steps": 1}, records, attempts)


def test_a_save_cut_off_by_a_killed_process_is_cleared_when_the_run_starts(monkeypatch, tmp_path):
    # A SIGKILL during a save left a temporary checkpoint directory and pointer file in the
    # run's own checkpoint directory: the next run there removes them, not the published ones.
    from rltrain.runners.checkpoint import CheckpointManager

    root = tmp_path / "checkpoints"
    published = CheckpointManager(str(root)).commit(CheckpointManager(str(root)).begin(2), {})
    (root / ".tmp-step-000004-0a1b2c3d").mkdir()
    (root / ".tmp-step-000004-0a1b2c3d" / "model.safetensors").write_bytes(b"half")
    (root / ".latest-0a1b2c3d").write_text("step-000004")
    done = {"status": "completed", "steps": 1, "wall_s": 1.0, "steps_per_s": 1.0}
    _, run = attempts_of(monkeypatch, tmp_path, [(done, 1)])
    app.train(run, str(tmp_path))
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002"]
    assert (root / "latest").read_text() == "step-000002" and published.endswith("step-000002")
