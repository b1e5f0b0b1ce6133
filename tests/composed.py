"""Configs composed from the shipped conf/ files as Hydra composes them (without a command line).

A uniquely named module in tests/ (on the test path, like ``suite_order``), so any test file can
import it.
"""

from __future__ import annotations

import pathlib

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from rltrain.config import load_config
from rltrain.config.schema import RunConfig
from rltrain.config.store import register_configs

CONF = pathlib.Path(__file__).resolve().parents[1] / "conf"


def composed(*overrides: str) -> DictConfig:
    """The composed config for ``overrides``, unchecked (as ``python -m rltrain`` composes it)."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def composed_run(*overrides: str) -> RunConfig:
    """The checked run config for ``overrides`` (:func:`rltrain.config.load_config`)."""
    return load_config(composed(*overrides))
