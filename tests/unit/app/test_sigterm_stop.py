"""SIGTERM while ``ray.init`` runs meets Ray's own driver handler, which raises
``SystemExit(15)``: the run stops there, as SIGTERM stops it at any other moment (status
``stopped``, no exception: exit 0), instead of failing with ``SystemExit: 15``."""

from __future__ import annotations

import json
import signal

from test_restart_policy import attempts_of

from rltrain import app


def test_ray_inits_sigterm_exit_is_a_stop_not_a_failure(monkeypatch, tmp_path):
    # what Ray's driver handler raises when SIGTERM comes while ray.init runs
    calls, run = attempts_of(monkeypatch, tmp_path, [(SystemExit(signal.SIGTERM), 0)] * 2)
    summary = app.train(run, str(tmp_path))
    assert len(calls) == 1
    assert summary["status"] == "stopped" and "cause" not in summary
    assert [a["status"] for a in summary["attempts"]] == ["stopped"]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "stopped"
