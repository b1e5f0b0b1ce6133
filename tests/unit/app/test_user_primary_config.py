"""A command whose primary config is the user's own (``--config-dir D --config-name myexp``, a
config composing rltrain's groups): the second look at a refused override composes that same
config, and a refused run leaves no run directory behind."""

from __future__ import annotations

import pathlib

import pytest
from rltrain_cli import rltrain_cli as cli

DEFAULTS = """\
defaults:
  - rltrain_schema
  - cluster: local
  - placement: collocated
  - model: tiny_llama
  - task: arithmetic
  - algorithm: grpo
  - _self_
mode: plan
"""


@pytest.fixture
def conf(tmp_path: pathlib.Path) -> pathlib.Path:
    """A config directory of the user's: four devices per node, a placement of its own."""
    d = tmp_path / "mycfg"
    (d / "placement").mkdir(parents=True)
    (d / "myexp.yaml").write_text(DEFAULTS + "cluster:\n  devices_per_node: 4\n")
    (d / "placement" / "mine.yaml").write_text(
        "mode: collocated\ncomponent_placement:\n  actor: all\n  rollout: all\n  reward: all\n"
    )
    return d


BAD = "trainer.total_steps=abc"


def test_the_other_overrides_are_checked_against_the_users_config(tmp_path, conf):
    # the user's cluster has 4 devices: actor=0-3 fits there (not in rltrain's own 2)
    for flags in (
        (f"--config-dir={conf}", "--config-name=myexp"),
        ("-cd", str(conf), "-cn", "myexp"),
    ):
        out = cli(*flags, "placement.component_placement.actor=0-3", BAD, cwd=tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "trainer.total_steps=abc is not a whole number" in out.stderr
        assert "configuration problems" not in out.stderr, out.stderr  # nothing else is wrong
    wrong = cli(
        f"--config-dir={conf}",
        "--config-name=myexp",
        "placement.component_placement.actor=0-7",
        BAD,
        cwd=tmp_path,
    )
    assert "2 configuration problems" in wrong.stderr
    assert "there are 4 accelerators" in wrong.stderr  # the user's cluster, not rltrain's


def test_a_group_option_of_the_users_config_dir_is_found(tmp_path, conf):
    out = cli(f"--config-dir={conf}", "mode=plan", "placement=mine", BAD, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Could not find" not in out.stderr, out.stderr
    assert "configuration problems" not in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == [conf]  # the second look wrote nothing


def test_a_refused_run_of_the_users_config_leaves_no_run_directory(tmp_path, conf):
    # the job is named __main__ (no hydra.job.name): Hydra's log is __main__.log, not rltrain.log
    (conf / "mine_cb.yaml").write_text(
        DEFAULTS
        + "hydra:\n  callbacks:\n    run_dir:\n      _target_: rltrain.app.RunDirCallback\n"
    )
    out = cli(
        "--config-dir",
        str(conf),
        "--config-name",
        "mine_cb",
        "trainer.total_steps=-1",
        "hydra.run.dir=r1",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "trainer.total_steps=-1 must be > 0" in out.stderr
    assert not (tmp_path / "r1").exists()
    # a directory of the user's keeps what was there and gets the refusal in the job's log
    mine = tmp_path / "r2"
    mine.mkdir()
    (mine / "__main__.log").write_text("notes\n")
    cli(
        "--config-dir",
        str(conf),
        "--config-name",
        "mine_cb",
        "trainer.total_steps=-1",
        "hydra.run.dir=r2",
        cwd=tmp_path,
    )
    assert sorted(p.name for p in mine.iterdir()) == ["__main__.log"]
    log = (mine / "__main__.log").read_text()
    assert log.startswith("notes\n") and "rltrain: refused: trainer.total_steps=-1" in log
