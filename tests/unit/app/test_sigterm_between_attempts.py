"""SIGTERM after a worker failure, while the failed attempt is torn down and its restart
prepared, stops the run there: no restart starts Ray, launches the workers or loads the
checkpoint before the loop would notice (status ``stopped``, no exception, no new step)."""

from __future__ import annotations

import json
import signal

from test_restart_policy import attempts_of, failure

from rltrain import app


def test_a_sigterm_while_a_restart_is_prepared_starts_no_further_attempt(monkeypatch, tmp_path):
    died = failure(None, "the worker process died while running 'train'")
    done = {"status": "completed", "steps": 6, "wall_s": 12.0, "steps_per_s": 0.5}
    calls, run = attempts_of(monkeypatch, tmp_path, [(died, 4), (done, 10)])
    restart_point = app._restart_point

    def preempted_meanwhile(*args):
        signal.raise_signal(signal.SIGTERM)  # the scheduler preempts the job now
        return restart_point(*args)

    monkeypatch.setattr(app, "_restart_point", preempted_meanwhile)
    summary = app.train(run, str(tmp_path))
    assert len(calls) == 1
    assert summary["status"] == "stopped" and "cause" not in summary
    assert [a["status"] for a in summary["attempts"]] == ["failed", "stopped"]
    assert summary["attempts"][1]["done_steps"] is None  # the restart trained nothing
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "stopped"
    # the restart it prepared never started: none was spent
    assert "restarts" not in summary
