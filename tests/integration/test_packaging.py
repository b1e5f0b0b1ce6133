"""The built wheel works from any directory: configs ship as ``pkg://rltrain.conf``."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_wheel_runs_outside_the_source_tree(tmp_path: pathlib.Path):
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = wheels.glob("rltrain-*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    assert (site / "rltrain" / "conf" / "placement" / "hybrid.yaml").is_file()
    assert not (site / "rltrain" / "bench").exists()  # benchmarks stay in the source tree
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import rltrain; print(rltrain.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(site))
    out = subprocess.run(
        [sys.executable, "-m", "rltrain", "--cfg", "job", "placement=hybrid"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "mode: hybrid" in out.stdout
    bench = subprocess.run(
        [sys.executable, "-m", "rltrain", "bench"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bench.returncode == 2 and "source checkout" in bench.stderr, bench.stderr
