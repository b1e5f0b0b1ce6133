"""Each job of a sweep writes into a directory of its own, and a row of the report shows only
what its job wrote; the launcher's timeouts are checked before anything runs.

The sweeps here only plan or are refused before Ray, so they start no Ray.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from hydra_plugins.rltrain_launcher._core import (
    Job,
    _check_options,
    _checkpoint_place,
    job_summary,
    refuse_shared_job_dirs,
)
from hydra_plugins.rltrain_launcher._plan import JobNeeds
from hydra_plugins.rltrain_launcher.rltrain_launcher import RltrainLauncher
from rltrain.errors import ConfigError

pytestmark = pytest.mark.timeout(600)


def sweep(tmp_path: pathlib.Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "rltrain", "-m", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )


def job(num: int, output_dir: str, **config: object) -> Job:
    cfg = OmegaConf.create({"hydra": {"sweep": {"subdir": "same"}, "job": {}}, **config})
    return Job(num, [], cfg, JobNeeds(), output_dir)


def test_jobs_given_one_output_directory_are_refused_naming_them_and_the_subdir():
    refuse_shared_job_dirs([job(0, "/s/0"), job(1, "/s/1")], {})  # the default: one each
    with pytest.raises(ConfigError) as info:
        refuse_shared_job_dirs([job(0, "/s/same"), job(1, "/s/same"), job(2, "/s/x")], {})
    assert info.value.problems[0] == "jobs #0, #1 would all write into '/s/same'"
    assert "hydra.sweep.subdir='same' gives these jobs one directory" in str(info.value)
    with pytest.raises(ConfigError, match="jobs #0, #3 would all write into '/s/x'"):
        refuse_shared_job_dirs([job(3, "/s/x")], {"/s/x": 0})  # an earlier batch's job


def test_a_sweep_whose_jobs_share_a_directory_runs_no_job(tmp_path):
    out = sweep(
        tmp_path,
        "placement=collocated,disaggregated",
        "mode=plan",
        "hydra.sweep.subdir=same",
        "hydra.sweep.dir=sw",
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"jobs #0, #1 would all write into '{tmp_path / 'sw' / 'same'}'" in out.stderr
    assert "hydra.sweep.subdir='same'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "sw" / "same").exists()


def test_checkpoint_dirs_are_compared_where_they_lie(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = job(0, str(tmp_path / "s" / "0"))
    places = {_checkpoint_place(plain, w) for w in ("ck", "./ck", "ck/", str(tmp_path / "ck"))}
    assert places == {str(tmp_path / "ck")}
    inside = job(1, str(tmp_path / "s" / "1"), hydra={"job": {"chdir": True}})
    assert _checkpoint_place(inside, "ck") == str(tmp_path / "s" / "1" / "ck")
    assert _checkpoint_place(plain, "s3://bucket/ck/") == "s3://bucket/ck"


def test_one_checkpoint_dir_spelled_two_ways_fails_both_jobs(tmp_path):
    out = sweep(
        tmp_path,
        "mode=plan",
        "trainer.checkpoint_dir=ck,./ck/",
        "hydra.sweep.dir=sw",
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "2 of 2 jobs failed" in text
    assert f"trainer.checkpoint_dir='./ck/' ({tmp_path / 'ck'}) is the checkpoint directory" in text


def test_only_a_summary_the_job_wrote_fills_its_row(tmp_path):
    run = job(0, str(tmp_path))
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 7}))
    assert job_summary(run) is None  # refused before its driver started
    run.start = time.time()
    run.summary_before = (os.stat(tmp_path / "summary.json").st_ino, 0)
    assert job_summary(run)["steps"] == 7  # another file than the one there before: the job's
    st = os.stat(tmp_path / "summary.json")
    run.summary_before = (st.st_ino, st.st_mtime_ns)
    assert job_summary(run) is None  # the earlier run's, untouched


def test_a_stale_summary_feeds_no_failed_or_planning_jobs_row(tmp_path):
    for num in ("0", "1"):  # an earlier sweep's job directories
        (tmp_path / "sw" / num).mkdir(parents=True)
        (tmp_path / "sw" / num / ".rltrain_run").write_text("")
        (tmp_path / "sw" / num / "summary.json").write_text(
            json.dumps({"steps": 77, "steps_per_s": 999.0, "status": "completed"})
        )
    out = sweep(tmp_path, "trainer.total_steps=-1,1", "mode=plan", "hydra.sweep.dir=sw")
    assert out.returncode == 2, out.stdout + out.stderr
    with open(tmp_path / "sw" / "sweep_report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["failed", "completed"]
    assert [(r["steps"], r["steps_per_s"]) for r in rows] == [("", ""), ("", "")]


@pytest.mark.parametrize(
    ("option", "value", "text"),
    [
        ("job_timeout_s", -5.0, "hydra.launcher.job_timeout_s=-5.0 must be > 0"),
        ("job_timeout_s", 0.0, "or null for no limit"),
        ("release_timeout_s", 0.0, "hydra.launcher.release_timeout_s=0.0 must be > 0"),
        ("release_timeout_s", float("nan"), "hydra.launcher.release_timeout_s=nan must be > 0"),
    ],
)
def test_timeouts_out_of_range_are_refused(option, value, text):
    launcher = RltrainLauncher(ray=OmegaConf.create({}), **{option: value})
    with pytest.raises(ConfigError, match=text.replace("(", r"\(").replace(".", r"\.")):
        _check_options(launcher)
    _check_options(RltrainLauncher(ray=OmegaConf.create({}), job_timeout_s=None))  # no limit


def test_a_bad_timeout_stops_the_sweep_before_any_job(tmp_path):
    out = sweep(
        tmp_path,
        "mode=plan",
        "trainer.total_steps=1,2",
        "hydra.launcher.job_timeout_s=-5",
        "hydra.sweep.dir=sw",
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "hydra.launcher.job_timeout_s=-5.0 must be > 0" in out.stderr
    assert not (tmp_path / "sw" / "0").exists()


def test_an_added_launcher_key_is_named():
    launcher = RltrainLauncher(ray=OmegaConf.create({}), foo=1)
    with pytest.raises(ConfigError) as info:
        _check_options(launcher)
    assert str(info.value) == (
        "hydra.launcher.foo is not an option of hydra/launcher=rltrain (known: ray, "
        "max_concurrent_jobs, job_timeout_s, release_timeout_s, report): remove "
        "+hydra.launcher.foo"
    )
