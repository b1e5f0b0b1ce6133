"""A sweep's job claims its run directory, is checked in its own environment and working
directory with its own command line, leaves no directory behind when the sweep stops before it
runs, and the report names every problem, in the cluster's numbering, even when the sweep is
interrupted.

The sweeps here are refused or only plan, with a ``ray`` package on the path that fails to
import: none may start (or import) Ray.
"""

from __future__ import annotations

import csv
import os
import pathlib
import subprocess
import sys

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from hydra_plugins.rltrain_launcher import _report
from hydra_plugins.rltrain_launcher._core import (
    Job,
    _as_the_job,
    _env_set,
    _report_interrupted,
    error_cell,
    in_cluster_numbering,
)
from hydra_plugins.rltrain_launcher._plan import JobNeeds, job_needs
from hydra_plugins.rltrain_launcher._slices import DeviceSlice
from hydra_plugins.rltrain_launcher.rltrain_launcher import RltrainLauncher
from rltrain.__main__ import explain_command_line
from rltrain.errors import ConfigError, WorkerError

pytestmark = pytest.mark.timeout(600)


def _sweep_without_ray(cwd: pathlib.Path, *overrides: str, env: dict[str, str] | None = None):
    fake = cwd / "no_ray" / "ray"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('this sweep must not import ray')\n")
    path = os.pathsep.join(p for p in (str(fake.parent), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "rltrain", "-m", *overrides]
    full_env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "200", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=540)


def _users_hydra_dir(where: pathlib.Path) -> pathlib.Path:
    (where / ".hydra").mkdir(parents=True)
    config = where / ".hydra" / "config.yaml"
    config.write_text("mine: true\n")
    return config


# ----------------------------------------------------------------- the job's run directory
def test_a_users_directory_is_refused_before_the_job_writes_hydra_files(tmp_path):
    config = _users_hydra_dir(tmp_path / "user1")
    (tmp_path / "user1" / "metrics.jsonl").write_text("{}\n")
    out = _sweep_without_ray(tmp_path, "mode=plan", "hydra.sweep.dir=user1", "hydra.sweep.subdir=.")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "job #0 cannot run: hydra.sweep.dir (with hydra.sweep.subdir)=" in text
    assert "holds metrics.jsonl, which no rltrain run wrote" in text
    assert "leave it at its default, multirun/<date>/<time>" in text
    assert config.read_text() == "mine: true\n"  # the driver never ran there


def test_an_earlier_runs_checkpoints_refuse_a_fresh_job_before_ray(tmp_path):
    job_dir = tmp_path / "sw" / "0"
    config = _users_hydra_dir(job_dir)
    (job_dir / ".rltrain_run").write_text("")
    (job_dir / "checkpoints" / "step-000001").mkdir(parents=True)
    (job_dir / "checkpoints" / "step-000001" / "trainer_state.json").write_text("{}")
    out = _sweep_without_ray(tmp_path, "trainer.total_steps=1", "hydra.sweep.dir=sw")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "must not import ray" not in text
    assert "job #0 cannot run:" in text and "holds an earlier run's checkpoints" in text
    assert "trainer.resume=auto" in text
    assert config.read_text() == "mine: true\n"


# ------------------------------------------------------ the job's environment and directory
def test_env_set_is_applied_when_the_launcher_resolves_a_job(tmp_path):
    out = _sweep_without_ray(
        tmp_path,
        "mode=plan",
        "task.name=jsonl",
        "task.path=${oc.env:REVL_DATA}",
        f"+hydra.job.env_set.REVL_DATA={tmp_path / 'jobs.jsonl'}",
        "hydra.sweep.dir=sw",
        env={"REVL_DATA": str(tmp_path / "launchers.jsonl")},
    )
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert f"task.path='{tmp_path / 'jobs.jsonl'}' does not exist" in text  # the job's value
    assert "launchers.jsonl" not in text


def test_with_chdir_relative_paths_are_checked_from_the_job_directory(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')  # not the job's
    out = _sweep_without_ray(
        tmp_path,
        "task.name=jsonl",
        "task.path=rows.jsonl",
        "hydra.job.chdir=true",
        "hydra.sweep.dir=sw",
    )
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "must not import ray" not in text
    assert "job #0 cannot run:" in text and "task.path='rows.jsonl' does not exist" in text
    assert not (tmp_path / "sw" / "0").exists()  # made for the check, removed with the refusal


def test_the_job_environment_and_directory_are_restored_after(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KEPT", "launcher")
    monkeypatch.delenv("ADDED", raising=False)
    env_set = {"KEPT": "${v}", "ADDED": 3}
    cfg = OmegaConf.create({"v": "job", "hydra": {"job": {"env_set": env_set}}})
    env = _env_set(cfg)
    assert env == {"KEPT": "job", "ADDED": "3"}
    job_dir = tmp_path / "sw" / "0"
    with _as_the_job(env, str(job_dir)) as refused:
        assert os.getcwd() == str(job_dir)
        assert (os.environ["KEPT"], os.environ["ADDED"]) == ("job", "3")
        refused.append(True)
    assert os.getcwd() == str(tmp_path) and os.environ["KEPT"] == "launcher"
    assert "ADDED" not in os.environ
    assert not (tmp_path / "sw").exists()  # refused: what was made for it is gone
    with pytest.raises(RuntimeError), _as_the_job({}, str(tmp_path / "crash" / "0")):
        raise RuntimeError("the check itself failed")
    assert not (tmp_path / "crash").exists()  # the sweep stops: nothing is left for the job
    with _as_the_job({}, str(job_dir)) as refused:
        refused.append(False)
    assert job_dir.is_dir()  # admitted: its driver runs there


def test_a_sweep_stopped_after_composing_leaves_no_job_directory(tmp_path):
    chdir = ("hydra.job.chdir=true", "hydra.sweep.dir=sw")
    out = _sweep_without_ray(tmp_path, *chdir, "cluster.devices_per_node=1,2")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "cluster.devices_per_node is 1 in job #0 but 2 in job #1" in text
    assert not (tmp_path / "sw" / "0").exists() and not (tmp_path / "sw" / "1").exists()
    out = _sweep_without_ray(tmp_path, *chdir, "hydra.sweep.subdir=same", "seed=1,2")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "jobs #0, #1 would all write into" in text
    assert not (tmp_path / "sw" / "same").exists()


# ----------------------------------------------------------------- the job's command line
def _composed(overrides: list[str]):
    """A job's config as Hydra merges it (``key={}`` merged, not yet emptied)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rltrain.config.store import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    conf = pathlib.Path(__file__).resolve().parents[3] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_a_jobs_empty_mapping_is_emptied_before_it_is_checked():
    # fuse=true refuses a rollout policy that moves state after each stage; the job's own
    # placement.offload={} drops that policy, as its driver will
    after_stage = ["placement.fuse=true", "placement.offload.rollout.when=after_stage"]
    emptied = [*after_stage, "placement.offload={}", "placement.offload.actor.when=on_demand"]
    needs = job_needs(_composed(emptied), overrides=emptied)
    assert needs.error is None and needs.placement_mode == "collocated"
    refused = job_needs(_composed(after_stage), overrides=after_stage).error
    assert "placement.offload.rollout.when=after_stage" in str(refused)


# ---------------------------------------------------------------------------- the report
def test_the_error_cell_keeps_every_problem_of_a_refusal():
    exc = ConfigError(["trainer.total_steps=-1 must be >= 1", "trainer.train_batch_size=0\n  x"])
    assert error_cell(exc) == (
        "ConfigError: trainer.total_steps=-1 must be >= 1; trainer.train_batch_size=0 x"
    )
    assert error_cell(ConfigError("one")) == "ConfigError: one"
    crash = WorkerError("group 'actor' rank 0 failed\nTraceback (most recent call last): ...")
    assert error_cell(crash) == "WorkerError: group 'actor' rank 0 failed"


def test_a_rerun_without_throughput_removes_the_earlier_chart(tmp_path):
    job = {"num": 0, "overrides": [], "status": "completed", "start": 1.0, "end": 2.0}
    measured = _report.make_row(job, {"steps": 1, "steps_per_s": 2.0})
    assert "png" in _report.write_report([measured], str(tmp_path))
    failed = _report.make_row({**job, "status": "failed", "error": "ConfigError: x"}, None)
    out = _report.write_report([failed], str(tmp_path))
    assert "png" not in out and not (tmp_path / _report.PNG_FILE).exists()


def test_peak_memory_is_keyed_by_the_clusters_devices():
    moved = DeviceSlice((((0, 0), (0, 2)), ((0, 1), (1, 0))))
    summary = {"steps": 1, "peak_memory_bytes_per_device": {"0:0": 70, "0:1": 5}}
    assert in_cluster_numbering(summary, moved)["peak_memory_bytes_per_device"] == {
        "0:2": 70,
        "1:0": 5,
    }
    assert summary["peak_memory_bytes_per_device"] == {"0:0": 70, "0:1": 5}  # not changed
    assert in_cluster_numbering(summary, DeviceSlice()) is summary
    assert in_cluster_numbering(None, moved) is None


def _job(num: int, output_dir: pathlib.Path, status: JobStatus | None) -> Job:
    cfg = OmegaConf.create({"hydra": {"job": {}}})
    job = Job(num, [f"x={num}"], cfg, JobNeeds(), str(output_dir))
    if status is not None:
        job.ret = JobReturn(status=status)
        job.ret.return_value = 1.0
        job.start, job.end = 10.0, 12.0
    return job


def test_an_interrupted_sweep_reports_what_ended(tmp_path, capsys):
    launcher = RltrainLauncher(ray=OmegaConf.create({}))
    jobs = [_job(0, tmp_path / "0", JobStatus.COMPLETED), _job(1, tmp_path / "1", None)]
    _report_interrupted(launcher, jobs, tmp_path)
    with open(tmp_path / _report.CSV_FILE, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"], r["job_s"]) for r in rows] == [
        ("0", "completed", "2.0"),
        ("1", "interrupted", ""),
    ]
    (tmp_path / "file").write_text("")
    _report_interrupted(launcher, jobs, tmp_path / "file")  # only logged: the interrupt goes on


# ------------------------------------------------------------------------- launcher errors
def test_a_sweep_directory_that_cannot_be_made_names_hydra_sweep_dir():
    exc = FileNotFoundError(2, "No such file or directory", "/proc/x/sw")
    assert "set hydra.sweep.dir to a writable directory" in explain_command_line(exc, sweep=True)
    assert "set hydra.run.dir to a writable directory" in explain_command_line(exc)


def test_an_unknown_ray_init_option_is_named_by_its_key():
    from hydra_plugins.rltrain_launcher._ray import _ray_init

    with pytest.raises(ConfigError, match=r"hydra\.launcher\.ray\.init\.bogus: not an option"):
        _ray_init(address="127.0.0.1:1", bogus=1)
