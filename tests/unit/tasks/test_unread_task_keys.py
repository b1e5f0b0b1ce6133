"""Task keys the chosen task would ignore are refused when the config is loaded."""

from __future__ import annotations

import pathlib

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config import load_config
from rltrain.config.store import register_configs
from rltrain.errors import ConfigError

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"


def _load(*overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=list(overrides)))


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("task.system_prompt=hi", "task.system_prompt='hi' is for a language task"),
        ("task.chat_template=true", "task.chat_template=True is for a language task"),
        ("task.reward_fn=rltrain.rewards.math:gsm8k", "task.reward_fn='rltrain.rewards.math"),
        ("+task.params.x=1", "task.params={'x': 1} sets a data generator"),
    ],
)
def test_language_task_keys_on_a_gym_task_are_refused(override, expected):
    with pytest.raises(ConfigError) as info:
        _load("experiment=cartpole_hybrid", override)
    (problem,) = info.value.problems
    assert expected in problem and "task.name='gym'" in problem


def test_generator_settings_on_the_arithmetic_task_are_refused():
    with pytest.raises(ConfigError) as info:
        _load("+task.params.max_number=7")
    (problem,) = info.value.problems
    assert "task.name='arithmetic' reads none of it: drop task.params.max_number" in problem
    assert _load("experiment=cartpole_hybrid").task.name == "gym"
