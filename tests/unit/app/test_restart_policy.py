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


def test_across_attempts_recomputes_the_per_step_measures():
    last = {"steps": 2, "wall_s": 1.0, "steps_per_s": 2.0, "seconds_per_stage": {"train": 9.0}}
    records = [{"step": s, "time/train_s": 0.5, "perf/tokens_per_s": 100.0} for s in range(4)]
    attempts = [
        {"first_step": 0, "done_steps": 3, "training_s": 3.0},
        {"first_step": 2, "done_steps": 4, "training_s": 1.0},
    ]
    out = across_attempts(last, records, attempts)
    assert out["steps"] == 4 and out["wall_s"] == 4.0 and out["steps_per_s"] == 1.0
    assert out["seconds_per_stage"] == {"train": 0.5} and out["tokens_per_s"] == 100.0


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
