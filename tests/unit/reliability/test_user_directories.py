"""Output keys pointed at a reader's own directories: nothing there is replaced or deleted.

``trainer.checkpoint_dir`` at a directory holding files rltrain did not write (a model, notes,
another tool's ``step-NNNNNN``) is refused before Ray, and so is one holding an earlier run's
checkpoints when the run starts afresh; the checkpoint writer itself replaces and prunes only
what a run's trainer state or manifest proves it wrote.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "app"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "docs"))

from test_front_door import compose_config, no_ray  # noqa: E402, F401 - the fixture
from user_files import fingerprint  # noqa: E402

from rltrain.errors import ResourceError, RltrainError  # noqa: E402
from rltrain.runners.checkpoint import CheckpointManager  # noqa: E402


def own_directory(root: pathlib.Path) -> pathlib.Path:
    """A reader's directory: notes, a ``latest`` file and another tool's ``step-000002``."""
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("mine")
    (root / "latest").write_text("v3\n")
    (root / "step-000002").mkdir()
    (root / "step-000002" / "weights.bin").write_bytes(b"x" * 64)
    return root


def refused(*overrides: str) -> str:
    from rltrain.app import run

    with pytest.raises(RltrainError) as info:
        run(compose_config(*overrides))
    return str(info.value)


@pytest.mark.parametrize("mode", ["train", "plan"])
def test_a_checkpoint_dir_holding_the_readers_files_is_refused(no_ray, mode):  # noqa: F811
    mine = own_directory(no_ray / "mine")
    before = fingerprint(mine)
    text = refused(f"mode={mode}", f"trainer.checkpoint_dir={mine}", "trainer.total_steps=2")
    assert f"trainer.checkpoint_dir='{mine}' holds files rltrain did not write" in text
    assert "notes.txt" in text and "step-000002/" in text and "new or empty directory" in text
    assert fingerprint(mine) == before


def test_a_checkpoint_dir_holding_an_earlier_run_needs_resume(no_ray, tmp_path):  # noqa: F811
    root = tmp_path / "ckpt"
    manager = CheckpointManager(str(root))
    manager.commit(manager.begin(2), {"note": "earlier run"})
    text = refused(f"trainer.checkpoint_dir={root}", "trainer.total_steps=4")
    assert "holds checkpoints of an earlier run (step-000002)" in text
    assert "trainer.resume=auto" in text


def test_the_writer_replaces_no_checkpoint_it_did_not_write(tmp_path):
    mine = own_directory(tmp_path / "mine")
    (mine / "latest").unlink()
    manager = CheckpointManager(str(mine))
    pending = manager.begin(2)
    with pytest.raises(ResourceError, match="rltrain did not write it"):
        manager.commit(pending, {})
    assert (mine / "step-000002" / "weights.bin").read_bytes() == b"x" * 64


def test_the_writer_keeps_a_latest_file_it_did_not_write(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "latest").write_text("my own pointer")
    manager = CheckpointManager(str(root))
    with pytest.raises(ResourceError, match="latest exists and rltrain did not write it"):
        manager.commit(manager.begin(1), {})
    assert (root / "latest").read_text() == "my own pointer"


def test_pruning_deletes_only_checkpoints_a_run_wrote(tmp_path):
    root = tmp_path / "ckpt"
    (root / "step-000001").mkdir(parents=True)
    (root / "step-000001" / "weights.bin").write_bytes(b"mine")
    manager = CheckpointManager(str(root), keep=1)
    for step in (2, 3):
        manager.commit(manager.begin(step), {})
    assert (root / "step-000001" / "weights.bin").read_bytes() == b"mine"
    assert not (root / "step-000002").exists()
    assert json.loads((root / "step-000003" / "trainer_state.json").read_text())["step"] == 3


def test_a_new_or_empty_checkpoint_dir_and_resume_auto_pass(tmp_path):
    from rltrain.config.files import checkpoint_dir_owner_problems

    empty = tmp_path / "empty"
    empty.mkdir()
    assert checkpoint_dir_owner_problems(str(empty), None) == []
    assert checkpoint_dir_owner_problems(str(tmp_path / "new"), None) == []
    manager = CheckpointManager(str(tmp_path / "ckpt"))
    manager.commit(manager.begin(2), {})
    assert checkpoint_dir_owner_problems(str(tmp_path / "ckpt"), "auto") == []
    assert len(checkpoint_dir_owner_problems(str(tmp_path / "ckpt"), None)) == 1


def plan_cli(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    flags = [a for a in args if a.startswith("-")]  # Hydra takes -m before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    return subprocess.run(
        [sys.executable, "-m", "rltrain", *flags, "mode=plan", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_a_run_dir_holding_the_readers_outputs_is_refused_and_a_runs_own_is_reused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"mine": 1}')
    (mine / "plan.json").write_text("my plan")
    out = plan_cli(f"hydra.run.dir={mine}", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"hydra.run.dir='{mine}' holds summary.json, plan.json" in out.stderr
    assert "new directory" in out.stderr and "Traceback" not in out.stderr
    assert (mine / "summary.json").read_text() == '{"mine": 1}'
    assert (mine / "plan.json").read_text() == "my plan"
    ours = tmp_path / "ours"
    for _ in range(2):  # a run's own directory may be planned into again
        out = plan_cli(f"hydra.run.dir={ours}", cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
    assert (ours / "plan.json").is_file()


def test_a_sweep_keeps_the_readers_report_and_jobs_share_no_checkpoint_dir(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sweep_report.md").write_text("my report")
    out = plan_cli("-m", f"hydra.sweep.dir={mine}", "trainer.total_steps=2,3", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"hydra.sweep.dir='{mine}' holds sweep_report.md" in out.stderr
    assert (mine / "sweep_report.md").read_text() == "my report"
    assert not (mine / "0").exists()
    shared = tmp_path / "ckpt"
    out = plan_cli(
        "-m", f"trainer.checkpoint_dir={shared}", "trainer.total_steps=2,3", cwd=tmp_path
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "2 of 2 jobs failed" in text
    assert f"trainer.checkpoint_dir='{shared}' is the checkpoint directory of jobs #0, #1" in text


def test_a_fresh_run_into_an_earlier_runs_directory_keeps_its_checkpoints(no_ray):  # noqa: F811
    from rltrain.app import RUN_STAMP

    (no_ray / RUN_STAMP).write_text("")
    manager = CheckpointManager(str(no_ray / "checkpoints"))
    manager.commit(manager.begin(2), {})
    before = fingerprint(no_ray / "checkpoints")
    text = refused("trainer.total_steps=4")
    assert "holds an earlier run's checkpoints (step-000002 in checkpoints/)" in text
    assert "trainer.resume=auto" in text
    assert fingerprint(no_ray / "checkpoints") == before


def test_rltrain_trace_redraws_its_own_png_and_keeps_the_readers(tmp_path):
    from rltrain.telemetry import timeline
    from rltrain.telemetry.draw import main
    from rltrain.telemetry.timeline import Span

    spans = [Span("train", "actor", ("node0/dev0",), "actor[0]", 0.0, 3e6, 1)]
    timeline.write_run_timeline(tmp_path, spans, ["node0/dev0"])
    assert main([str(tmp_path)]) == 0
    assert main([str(tmp_path)]) == 0  # its own drawing is replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "trace.json").write_text((tmp_path / "trace.json").read_text())
    (mine / "trace.png").write_bytes(b"\x89PNG my own picture")
    assert main([str(mine / "trace.json")]) == 2
    assert (mine / "trace.png").read_bytes() == b"\x89PNG my own picture"
    assert main([str(mine / "trace.json"), "--out", str(mine / "drawn.png")]) == 0


def test_a_model_read_from_a_checkpoint_the_run_may_prune_is_refused(no_ray):  # noqa: F811
    root = no_ray / "ckpt"
    manager = CheckpointManager(str(root))
    pending = manager.begin(2)
    (pathlib.Path(pending.path) / "model").mkdir()
    (pathlib.Path(pending.path) / "model" / "config.json").write_text("{}")
    manager.commit(pending, {})
    model = root / "step-000002" / "model"
    text = refused(f"trainer.checkpoint_dir={root}", "trainer.resume=auto", f"model.path={model}")
    assert f"model.path='{model}' lies in trainer.checkpoint_dir='{root}'" in text
    assert "copy step-000002 out of it" in text


def test_a_refused_run_keeps_an_earlier_runs_directory_and_log(tmp_path):
    earlier = tmp_path / "run"
    earlier.mkdir()
    (earlier / ".rltrain_run").write_text("")
    (earlier / "rltrain.log").write_text("the earlier run's log\n")
    out = plan_cli(f"hydra.run.dir={earlier}", "trainer.train_batch_size=3", cwd=tmp_path)
    assert out.returncode == 2 and "trainer.train_batch_size=3" in out.stderr
    log = (earlier / "rltrain.log").read_text()
    assert log.startswith("the earlier run's log\n") and "rltrain: refused:" in log
