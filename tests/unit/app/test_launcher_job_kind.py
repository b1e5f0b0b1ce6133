"""The rltrain launcher plans a job as an rltrain run only when its config is rltrain's."""

from __future__ import annotations

import pathlib

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from hydra_plugins.rltrain_launcher._plan import is_rltrain_config, job_needs
from rltrain.config.store import register_configs

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"


def test_another_apps_sections_of_the_same_names_are_not_an_rltrain_run():
    foreign = OmegaConf.create(
        {"cluster": {"nodes": 1}, "placement": {"mode": "mine"}, "trainer": {"epochs": 3}}
    )
    assert not is_rltrain_config(foreign)
    needs = job_needs(foreign)
    assert needs.error is None and needs.cluster is None and not needs.uses_ray


def test_rltrain_configs_typed_or_plain_are_rltrain_runs():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["mode=plan"])
    GlobalHydra.instance().clear()
    assert is_rltrain_config(cfg)  # typed by the run schema
    plain = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    assert is_rltrain_config(plain)  # every section of the schema
    assert not is_rltrain_config(OmegaConf.structured(cfg.trainer))  # a section alone
