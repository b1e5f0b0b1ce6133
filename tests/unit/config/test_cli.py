"""The real entry point in a subprocess: overrides, bad input and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    env.pop("HYDRA_FULL_ERROR")
    return subprocess.run(
        [sys.executable, "-m", "rltrain", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


def test_cfg_job_shows_the_chosen_placement():
    out = run_cli("--cfg", "job", "placement=hybrid", "placement.component_placement.actor=0-1")
    assert out.returncode == 0, out.stderr
    assert "mode: hybrid" in out.stdout
    assert "actor: 0-1" in out.stdout


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("placement=hybird", "hybrid"),  # the message lists the valid options
        ("cluster.num_nodes=two", "cluster.num_nodes"),
        ("+placement.colour=red", "placement.colour"),
        ("algorithm.kl_estimator=k9", "algorithm.kl_estimator"),
    ],
)
def test_bad_input_names_the_key_and_fails(override: str, expected: str):
    out = run_cli(override)
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_key_lists_the_known_ones():
    out = run_cli("+trainer.totl_steps=3")
    assert out.returncode == 2
    assert "total_steps" in out.stderr
