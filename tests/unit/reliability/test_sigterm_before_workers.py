"""SIGTERM recorded while Ray starts, before Ray installs its own handler, stops the job
before any worker group is launched (the loop would notice it only after every group started
and the checkpoint loaded). The cluster is a stand-in whose start receives the signal."""

from __future__ import annotations

import contextlib
import signal

import pytest

from rltrain.config.schema import RunConfig
from rltrain.runners import job
from rltrain.scheduler import interrupts


class _PreemptedWhileStarting:
    """A cluster whose start is where SIGTERM arrives."""

    @classmethod
    def start(cls, config):
        signal.raise_signal(signal.SIGTERM)
        return contextlib.nullcontext(object())


def test_a_sigterm_while_ray_starts_launches_no_worker(monkeypatch, tmp_path):
    monkeypatch.setattr(job, "Cluster", _PreemptedWhileStarting)
    built: list[str] = []
    run = RunConfig()
    run.logging.trace = False
    with interrupts.termination_requests():
        with pytest.raises(SystemExit) as info:
            with job.start_job(run, str(tmp_path), {"actor": built.append}):
                pytest.fail("the job started")
    assert info.value.code == signal.SIGTERM and interrupts.terminated(info.value)
    assert built == []
