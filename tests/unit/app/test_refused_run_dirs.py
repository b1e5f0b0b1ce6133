"""A refused single run removes only what it created: never a directory or file that was there
before it started (the user's own, the working directory), and Hydra writes no ``.hydra/`` into
a directory the run refuses."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
from rltrain_cli import rltrain_cli as cli

from rltrain.app import RUN_OUTPUTS, _remove_if_untouched, note_before_run


def refused_cli(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """A command refused before Ray: ``trainer.total_steps=-1`` fails the config checks."""
    return cli("trainer.total_steps=-1", *args, cwd=cwd)


def assert_refused(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "rltrain: error: trainer.total_steps=-1 must be > 0" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_empty_directory_of_the_users_is_kept(tmp_path):
    (tmp_path / "uB").mkdir()
    assert_refused(refused_cli("hydra.run.dir=uB", cwd=tmp_path))
    assert (tmp_path / "uB").is_dir() and list((tmp_path / "uB").iterdir()) == []


def test_the_users_log_file_is_kept_and_gets_the_refusal(tmp_path):
    mine = tmp_path / "uC"
    mine.mkdir()
    (mine / "rltrain.log").write_text("notes\n")
    assert_refused(refused_cli("hydra.run.dir=uC", cwd=tmp_path))
    assert sorted(p.name for p in mine.iterdir()) == ["rltrain.log"]  # .hydra/ was this run's
    log = (mine / "rltrain.log").read_text()
    assert log.startswith("notes\n") and "rltrain: refused: trainer.total_steps=-1" in log


@pytest.mark.parametrize("where", ["hydra.run.dir=.", "hydra.job.chdir=true"])
def test_the_working_directory_is_never_removed(tmp_path, where):
    here = tmp_path / "here"
    here.mkdir()
    assert_refused(refused_cli(where, cwd=here))
    assert here.is_dir() and list(here.iterdir()) == []  # the run's own outputs/ went too


def test_a_parent_that_was_there_is_kept(tmp_path):
    (tmp_path / "outputs").mkdir()
    assert_refused(refused_cli(cwd=tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["outputs"]
    assert list((tmp_path / "outputs").iterdir()) == []


def test_hydra_writes_nothing_into_a_directory_the_run_refuses(tmp_path):
    mine = tmp_path / "uE"
    (mine / ".hydra").mkdir(parents=True)
    (mine / ".hydra" / "config.yaml").write_text("seed: 777\n")
    (mine / "metrics.jsonl").write_text("{}\n")
    out = cli("mode=plan", "seed=5", "hydra.run.dir=uE", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "hydra.run.dir=" in out.stderr and "holds metrics.jsonl" in out.stderr
    assert (mine / ".hydra" / "config.yaml").read_text() == "seed: 777\n"
    assert sorted(p.name for p in mine.iterdir()) == [".hydra", "metrics.jsonl"]


def test_what_was_there_before_the_run_is_never_removed(tmp_path):
    existing = tmp_path / "existing"
    (existing / ".hydra").mkdir(parents=True)
    note_before_run(str(existing))
    (existing / "rltrain.log").write_text("this run's log\n")
    assert _remove_if_untouched(str(existing)) is True  # nothing of this run left to log into
    assert [p.name for p in existing.iterdir()] == [".hydra"]
    unknown = tmp_path / "unknown"  # no record of what was there: nothing is removed
    (unknown / ".hydra").mkdir(parents=True)
    assert _remove_if_untouched(str(unknown)) is False and (unknown / ".hydra").is_dir()


def test_every_file_auto_placement_writes_is_a_run_output():
    import importlib

    choose = importlib.import_module("rltrain.autoplace.choose")
    for name in (choose.RANKING_FILE, choose.TEXT_FILE, choose.PROFILE_DIR):
        assert name in RUN_OUTPUTS


def test_a_users_auto_placement_text_is_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "auto_placement.txt").write_text("my notes")
    out = cli("hydra.run.dir=mine", "placement=auto", "mode=plan", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "holds auto_placement.txt" in out.stderr
    assert (mine / "auto_placement.txt").read_text() == "my notes"
