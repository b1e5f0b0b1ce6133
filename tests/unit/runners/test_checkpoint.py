"""Checkpoints are atomic: a crash mid-write leaves the previous one usable."""

from __future__ import annotations

import os

import pytest

from rltrain.errors import ConfigError
from rltrain.runners.checkpoint import CheckpointManager, read_state


def write_payload(path: str, text: str) -> None:
    with open(os.path.join(path, "model.txt"), "w") as f:
        f.write(text)


def test_commit_publishes_and_latest_points_at_it(tmp_path):
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    assert mgr.latest() is None and mgr.resolve("auto") is None
    p = mgr.begin(5)
    write_payload(p.path, "five")
    final = mgr.commit(p, {"cursor": 40})
    assert final.endswith("step-000005")
    assert mgr.latest() == final
    assert read_state(final) == {"cursor": 40, "step": 5}
    assert open(os.path.join(final, "model.txt")).read() == "five"


def test_crash_mid_write_keeps_previous_latest(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    p = mgr.begin(1)
    write_payload(p.path, "one")
    good = mgr.commit(p, {})
    crashed = mgr.begin(2)  # the workers wrote half of it, then the driver died
    write_payload(crashed.path, "half")
    again = CheckpointManager(str(tmp_path))
    assert again.resolve("auto") == good
    assert read_state(good)["step"] == 1


def test_keep_prunes_old_checkpoints(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep=2)
    for step in (1, 2, 3):
        mgr.commit(mgr.begin(step), {})
    names = sorted(n for n in os.listdir(tmp_path) if n.startswith("step-"))
    assert names == ["step-000002", "step-000003"]


def test_resume_from_a_root_or_a_step_dir_and_bad_path(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    final = mgr.commit(mgr.begin(7), {})
    assert mgr.resolve(str(tmp_path)) == final
    assert mgr.resolve(final) == final
    with pytest.raises(ConfigError, match="trainer.resume"):
        mgr.resolve(str(tmp_path / "nowhere"))


def test_memory_filesystem_uri_works():
    mgr = CheckpointManager("memory://rltrain-test/ckpt")
    final = mgr.commit(mgr.begin(3), {"x": 1})
    assert final.startswith("memory://")
    assert read_state(final)["x"] == 1


def test_the_runners_save_and_resume_hooks_write_load_and_refuse_another_model(tmp_path):
    """Both runners' hooks (``save_state`` / ``resume_state``): the workers write into the
    pending checkpoint, the record carries the model fingerprint and the run's settings, a
    resume loads the checkpoint and a checkpoint of another model is refused naming the key."""
    from rltrain.config.schema import RunConfig
    from rltrain.runners.checkpoint import resume_state, save_state

    run = RunConfig()
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    final = save_state(mgr, run, 7, "model-a", lambda path: write_payload(path, "seven"))
    state = read_state(final)
    assert state["model"] == "model-a" and state["step"] == 7
    run.trainer.resume = "auto"
    loaded: list[str] = []
    assert resume_state(mgr, run, "model-a", "model settings", loaded.append) == 7
    assert loaded == [final] and open(os.path.join(final, "model.txt")).read() == "seven"
    with pytest.raises(ConfigError, match=r"trainer.resume=.* written for model-a .* model-b"):
        resume_state(mgr, run, "model-b", "model settings", loaded.append)
    assert len(loaded) == 1  # nothing loaded from the refused checkpoint
    run.trainer.resume = None
    assert resume_state(mgr, run, "model-a", "model settings", loaded.append) == 0


def test_a_checkpoint_just_published_is_never_pruned_and_a_damaged_one_falls_back_to_older(
    tmp_path,
):
    # Later step directories another lineage left (written before the refusal below existed,
    # or by hand): publishing step 4 must not prune step 4 itself, and latest may not fall back
    # to them when the pointed-at checkpoint is damaged.
    mgr = CheckpointManager(str(tmp_path), keep=2)
    for step in (6, 8):
        mgr.commit(mgr.begin(step), {})
    four = mgr.commit(mgr.begin(4), {})
    assert os.path.isdir(four) and mgr.latest() == four
    os.remove(os.path.join(four, "trainer_state.json"))
    assert mgr.latest() is None  # nothing older than step 4 is left; step 8 is not taken


def test_resuming_a_path_into_a_directory_with_later_checkpoints_is_refused(tmp_path):
    from rltrain.config.schema import RunConfig
    from rltrain.runners.checkpoint import resolve_resume

    other = CheckpointManager(str(tmp_path / "other" / "checkpoints"))
    four = other.commit(other.begin(4), {"model": None})
    own = CheckpointManager(str(tmp_path / "run" / "checkpoints"))
    for step in (6, 8):
        own.commit(own.begin(step), {})
    run = RunConfig()
    run.trainer.resume, run.trainer.total_steps = four, 10
    with pytest.raises(ConfigError, match=r"holds later checkpoints \(step-000006, step-000008\)"):
        resolve_resume(run, str(tmp_path / "run"))
    resolve_resume(run, str(tmp_path / "fresh"))  # a new run directory: nothing to replace
