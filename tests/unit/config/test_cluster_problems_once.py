"""One cluster problem is reported once, with a fix, though the config's checks and the
cluster's own both find it (no Ray)."""

from __future__ import annotations

import pathlib

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config.store import register_configs
from rltrain.errors import ConfigError

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"


def problems(*overrides: str) -> list[str]:
    from rltrain.app import _checked

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["mode=plan", *overrides])
    with pytest.raises(ConfigError) as info:
        _checked(cfg, None)
    return list(info.value.problems)


def test_no_nodes_is_said_once_with_a_fix():
    assert problems("cluster.num_nodes=0") == [
        "cluster.num_nodes=0 is not a whole number >= 1: set cluster.num_nodes to an integer >= 1"
    ]


def test_a_device_list_of_the_wrong_length_is_said_once():
    assert problems("cluster.num_nodes=2", "cluster.devices_per_node=[2,2,2]") == [
        "cluster.devices_per_node has 3 entries but cluster.num_nodes=2: give one entry per "
        "node, or a single int for all nodes"
    ]
