"""Placement sweeps end to end: ``python -m rltrain -m ...`` and concurrent jobs on one Ray."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest

from rltrain.errors import WorkerError

HERE = pathlib.Path(__file__).resolve().parent
pytestmark = [pytest.mark.timeout(600), pytest.mark.spread]  # spread: no module fixture

ONE_DEVICE = """\
mode: collocated
component_placement:
  actor,rollout: "0"
  reward: {node_group: node, placement: "0"}
"""
TOO_BIG = """\
component_placement:
  actor,rollout: 0-3
"""


def _sweep(args: list[str], cwd: pathlib.Path, env: dict | None = None):
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=540,
    )


def _report(sweep_dir: pathlib.Path) -> list[dict[str, str]]:
    with open(sweep_dir / "sweep_report.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_placement_sweep_writes_job_dirs_and_a_report(tmp_path, join_flag):
    sweep_dir = tmp_path / "sweep"
    out = _sweep(
        # A short budget, in two batches (2 jobs, then 1) as sweepers such as Optuna launch them.
        ["-m", "rltrain", "-m", "placement=collocated,disaggregated,hybrid",
         "trainer.total_steps=2", "trainer.train_batch_size=2", "rollout.n_samples_per_prompt=4",
         "logging.progress=false", "hydra.sweeper.max_batch_size=2",
         f"hydra.sweep.dir={sweep_dir}", join_flag],
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    for num in range(3):
        assert (sweep_dir / str(num) / ".hydra" / "config.yaml").is_file()
        assert (sweep_dir / str(num) / "rltrain.log").is_file()
    rows = _report(sweep_dir)
    assert [r["placement_mode"] for r in rows] == ["collocated", "disaggregated", "hybrid"]
    assert [r["status"] for r in rows] == ["completed"] * 3
    # Filled from each job's summary.json; the objective is what the job returned to Hydra.
    assert [r["steps"] for r in rows] == ["2"] * 3
    assert all(float(r["steps_per_s"]) > 0 and r["objective"] for r in rows)
    assert [r["simulated"] for r in rows] == ["True"] * 3
    # Each job traced its devices (logging.trace defaults to true): the utilization columns.
    assert all(0 < float(r["busy_mean"]) <= 1 and r["longest_idle_s"] for r in rows)
    table = (sweep_dir / "sweep_report.md").read_text()
    assert table.count("| completed |") == 3 and "simulated devices" in table
    assert (sweep_dir / "sweep_throughput.png").is_file()
    assert out.stdout.count("Sweep report") == 2  # printed after each batch, the last has all


def test_disjoint_jobs_run_side_by_side_and_an_impossible_one_fails_alone(tmp_path, join_flag):
    conf = tmp_path / "conf" / "placement"
    conf.mkdir(parents=True)
    (conf / "one_a.yaml").write_text(ONE_DEVICE)
    (conf / "one_b.yaml").write_text(ONE_DEVICE)
    (conf / "too_big.yaml").write_text(TOO_BIG)
    probe, sweep_dir = tmp_path / "probe", tmp_path / "sweep"
    probe.mkdir()
    out = _sweep(
        [str(HERE / "probe_app.py"), "-m", "placement=one_a,one_b,too_big",
         f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "hydra.launcher.max_concurrent_jobs=2",
         f"hydra.sweep.dir={sweep_dir}", join_flag],
        cwd=tmp_path,
        env={"PROBE_DIR": str(probe), "PROBE_PEERS": "2"},
    )  # fmt: skip
    # The impossible job fails the sweep, at once and alone, with its reason.
    assert out.returncode != 0
    said = out.stdout + out.stderr  # Hydra logs to stdout, errors go to stderr
    assert "job #2 cannot run: placement.component_placement" in said  # the planner's message
    assert "asks for resource 3" in said
    a, b = (json.loads((probe / f"{n}.json").read_text()) for n in (0, 1))
    assert a["start"] < b["end"] and b["start"] < a["end"]  # both held devices at once
    assert len(a["devices"]) == len(b["devices"]) == 1
    assert a["devices"] != b["devices"]  # Ray gave them different devices
    assert json.loads(a["slice"])[0]["cluster"] != json.loads(b["slice"])[0]["cluster"]
    rows = _report(sweep_dir)
    assert [r["status"] for r in rows] == ["completed", "completed", "failed"]
    assert rows[2]["error"].startswith("PlacementError") and rows[2]["devices"] == ""
    assert {rows[0]["devices"], rows[1]["devices"]} == {"n0:d0", "n0:d1"}


def test_a_crashed_job_leaves_nothing_behind_for_the_next(tmp_path, join_flag):
    probe, sweep_dir = tmp_path / "probe", tmp_path / "sweep"
    probe.mkdir()
    out = _sweep(
        # Both jobs use every device; the first dies holding them.
        [str(HERE / "probe_app.py"), "-m", "seed=13,1", "placement=collocated",
         f"hydra.sweep.dir={sweep_dir}", join_flag],
        cwd=tmp_path,
        env={"PROBE_DIR": str(probe), "PROBE_PEERS": "1"},
    )  # fmt: skip
    assert out.returncode != 0
    assert "job #0 (seed=13 placement=collocated) exited with code 3" in out.stdout + out.stderr
    second = json.loads((probe / "1.json").read_text())
    assert len(second["devices"]) == 2  # got both devices back from the crashed job
    assert [r["status"] for r in _report(sweep_dir)] == ["failed", "completed"]


def test_a_sweep_over_cluster_keys_is_refused_before_anything_runs(tmp_path):
    out = _sweep(
        ["-m", "rltrain", "-m", "cluster.devices_per_node=2,4", "mode=plan",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2  # rltrain's configuration-error exit
    assert "cluster.devices_per_node is 2 in job #0 but 4 in job #1" in out.stderr
    assert "one cluster" in out.stderr
    assert not (tmp_path / "sweep" / "0").exists()


def _hang(cfg) -> None:
    threading.Event().wait()  # never set: only the launcher's timeout ends this job


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_a_job_past_its_timeout_is_killed_and_fails(hydra_sweep_runner, tmp_path, ray_address):
    sweep = hydra_sweep_runner(
        calling_file=None,
        calling_module="hydra.test_utils.a_module",
        task_function=_hang,
        config_path="configs",
        config_name="compose.yaml",
        overrides=["hydra/launcher=rltrain", "hydra.launcher.job_timeout_s=2"],
        temp_dir=tmp_path,
    )
    with pytest.raises(WorkerError, match=r"job #0 \(no overrides\) was killed after .*=2"):
        with sweep:
            pass
    rows = _report(tmp_path)
    assert rows[0]["status"] == "failed" and "killed" in rows[0]["error"]
