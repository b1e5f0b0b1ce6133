"""``trainer.resume``: resolved before Ray starts, across invocations for ``auto``."""

from __future__ import annotations

import os
import pathlib

import pytest
from omegaconf import OmegaConf
from test_front_door import compose_config

from rltrain.config import load_config
from rltrain.errors import ConfigError
from rltrain.runners.checkpoint import CheckpointManager, model_fingerprint, resolve_resume


def earlier_run(root: pathlib.Path, name: str, steps: list[int], *overrides: str) -> str:
    """A finished run directory as Hydra and rltrain leave it: its config and checkpoints."""
    run_dir = root / name
    cfg = compose_config(*overrides)
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    manager = CheckpointManager(str(run_dir / "checkpoints"), keep=0)
    run = load_config(cfg)
    for step in steps:
        manager.commit(manager.begin(step), {"model": model_fingerprint(run)})
    return str(run_dir / "checkpoints" / f"step-{steps[-1]:06d}") if steps else ""


def auto(*overrides: str):
    return load_config(compose_config("trainer.resume=auto", *overrides))


def test_auto_finds_the_previous_invocation(tmp_path):
    outputs = tmp_path / "outputs" / "2026-11-25"
    expected = earlier_run(outputs, "10-00-00", [2, 4])
    found = resolve_resume(auto(), str(outputs / "11-00-00"))
    assert found.path == expected
    assert "step 4" in found.note and "earlier run" in found.note


def test_auto_takes_the_newest_checkpoint_of_the_experiment(tmp_path):
    day1, day2 = tmp_path / "outputs" / "2026-11-24", tmp_path / "outputs" / "2026-11-25"
    older = earlier_run(day1, "23-00-00", [8])
    newer = earlier_run(day2, "01-00-00", [2])
    os.utime(os.path.join(older, "trainer_state.json"), (1, 1))
    assert resolve_resume(auto(), str(day2 / "02-00-00")).path == newer


def test_auto_ignores_other_experiments(tmp_path):
    outputs = tmp_path / "outputs" / "2026-11-25"
    earlier_run(outputs, "10-00-00", [4], "seed=7")
    earlier_run(outputs, "10-30-00", [4], "model.hidden_size=32")
    found = resolve_resume(auto(), str(outputs / "11-00-00"))
    assert found.path is None
    assert "starting at step 0" in found.note


def test_auto_prefers_this_runs_own_checkpoints(tmp_path):
    outputs = tmp_path / "outputs" / "2026-11-25"
    earlier_run(outputs, "10-00-00", [8])
    own = earlier_run(outputs, "11-00-00", [2])
    assert resolve_resume(auto(), str(outputs / "11-00-00")).path == own


def test_moving_workers_keeps_the_experiment(tmp_path):
    outputs = tmp_path / "outputs" / "2026-11-25"
    expected = earlier_run(outputs, "10-00-00", [4], "placement=disaggregated")
    found = resolve_resume(auto("placement=hybrid"), str(outputs / "11-00-00"))
    assert found.path == expected


def test_a_checkpoint_of_another_model_is_refused_before_ray(tmp_path):
    path = earlier_run(tmp_path, "run", [4], "model.hidden_size=32")
    run = load_config(compose_config(f"trainer.resume={path}"))
    with pytest.raises(ConfigError, match="model.hidden_size|h32"):
        resolve_resume(run, str(tmp_path / "new"))


def test_a_directory_without_a_checkpoint_is_refused(tmp_path):
    run = load_config(compose_config(f"trainer.resume={tmp_path}"))
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        resolve_resume(run, str(tmp_path / "new"))


def recorded_run(root: pathlib.Path, name: str, step: int, *overrides: str) -> str:
    """A run directory whose checkpoint records the settings it was written with."""
    from rltrain.runners.checkpoint import training_record

    run_dir = root / name
    cfg = compose_config(*overrides)
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    run = load_config(cfg)
    manager = CheckpointManager(str(run_dir / "checkpoints"))
    record = {"model": model_fingerprint(run), **training_record(run)}
    return manager.commit(manager.begin(step), record)


def test_auto_lists_every_training_setting_that_changed(tmp_path):
    outputs = tmp_path / "outputs" / "2026-11-26"
    expected = recorded_run(outputs, "10-00-00", 4, "optimizer.lr=1e-4", "rollout.temperature=0.7")
    found = resolve_resume(auto(), str(outputs / "11-00-00"))
    assert found.path == expected
    text = "\n".join(found.differences)
    assert "optimizer.lr: 0.0001 in the checkpoint, 0.0003 now" in text
    assert "rollout.temperature: 0.7 in the checkpoint, 1.0 now" in text
    assert len(found.differences) == 2


def test_settings_of_a_checkpoint_without_a_record_come_from_its_run(tmp_path):
    outputs = tmp_path / "outputs" / "2026-11-26"
    earlier_run(outputs, "10-00-00", [4], "trainer.train_batch_size=4")
    found = resolve_resume(auto(), str(outputs / "11-00-00"))
    assert found.differences == (
        "resuming with a setting changed: trainer.train_batch_size: 4 in the checkpoint, 8 now",
    )


def test_auto_says_what_it_passed_over_when_nothing_is_resumed(tmp_path):
    outputs = tmp_path / "outputs" / "2026-11-26"
    other = recorded_run(outputs, "10-00-00", 4, "seed=7")
    found = resolve_resume(auto(), str(outputs / "11-00-00"))
    assert found.path is None and "starting at step 0" in found.note
    assert other in found.note and "seed: 7 in the checkpoint, 1 now" in found.note


def test_another_reward_is_another_experiment(tmp_path):
    import json

    rm = tmp_path / "rm"
    rm.mkdir()
    (rm / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForSequenceClassification"]})
    )
    outputs = tmp_path / "outputs" / "2026-11-26"
    recorded_run(outputs, "10-00-00", 4, "reward.kind=model", f"reward.model_path={rm}")
    found = resolve_resume(auto(), str(outputs / "11-00-00"))
    assert found.path is None and "reward.kind: 'model' in the checkpoint" in found.note


def test_auto_refuses_another_experiments_checkpoint_in_its_own_directory(tmp_path):
    shared = tmp_path / "shared"
    run = load_config(compose_config("seed=7"))
    manager = CheckpointManager(str(shared))
    from rltrain.runners.checkpoint import training_record

    path = manager.commit(
        manager.begin(4), {"model": model_fingerprint(run), **training_record(run)}
    )
    with pytest.raises(ConfigError) as info:
        resolve_resume(auto(f"trainer.checkpoint_dir={shared}"), str(tmp_path / "new"))
    text = str(info.value)
    assert "another experiment" in text and "seed: 7 in the checkpoint, 1 now" in text
    assert f"trainer.resume={path}" in text  # the way to continue it on purpose


def test_a_named_checkpoint_of_another_experiment_continues_with_its_differences(tmp_path):
    path = recorded_run(tmp_path, "run", 4, "seed=7")
    run = load_config(compose_config(f"trainer.resume={path}"))
    found = resolve_resume(run, str(tmp_path / "new"))
    assert found.path == path
    assert any("seed: 7 in the checkpoint, 1 now" in d for d in found.differences)


def test_resuming_past_the_last_step_is_refused(tmp_path):
    outputs = tmp_path / "outputs" / "2026-11-26"
    recorded_run(outputs, "10-00-00", 8)
    with pytest.raises(ConfigError, match="at step 8, and trainer.total_steps=8"):
        resolve_resume(auto("trainer.total_steps=8"), str(outputs / "11-00-00"))
