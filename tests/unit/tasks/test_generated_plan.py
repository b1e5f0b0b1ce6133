"""A run whose checkpoint task.generate writes can be planned before anything exists.

The plan reads the model sizes from ``model.path``'s ``config.json``; with ``task.generate`` that
file is written by the generator, so every place that checks a training run before it starts
(the entry point, ``placement=auto``, the sweep launcher's per-job check) writes it first. A
run that only plans writes nothing: its plan is sized from the model fields.
"""

from __future__ import annotations

import pathlib

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from hydra_plugins.rltrain_launcher._plan import job_needs
from rltrain.config.store import register_configs

ROOT = pathlib.Path(__file__).resolve().parents[3]
SMALL = [
    "experiment=gsm8k_tiny",
    "task.params.num_train=200",
    "task.params.num_eval=8",
    "task.params.sft_steps=2",
]


def test_the_launcher_plans_a_gsm8k_tiny_job_on_a_fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRAIN_CACHE", str(tmp_path))
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=SMALL)
    task_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    needs = job_needs(task_cfg)
    assert needs.error is None, needs.error
    assert needs.devices and needs.uses_ray
    assert (tmp_path / "gsm8k_tiny" / "base_model" / "config.json").is_file()


def test_a_planning_job_writes_nothing_and_is_sized_from_the_model_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRAIN_CACHE", str(tmp_path))
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*SMALL, "mode=plan"])
    task_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    needs = job_needs(task_cfg)
    assert needs.error is None, needs.error
    assert needs.placement_mode == "collocated" and not needs.uses_ray and not needs.devices
    assert list(tmp_path.iterdir()) == []
