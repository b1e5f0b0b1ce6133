"""The command :mod:`rltrain.tasks.python_tool`'s docstring shows passes the config checks."""

from __future__ import annotations

import pathlib
import shlex

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import rltrain.tasks.python_tool as python_tool
from rltrain.config import load_config
from rltrain.config.store import register_configs
from rltrain.tasks.text_env import env_problems

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"


def _shown_commands() -> list[list[str]]:
    """The ``python -m rltrain ...`` lines of the docstring, continuations joined."""
    text = python_tool.__doc__.replace("\\\n", " ")
    prefix = "python -m rltrain "
    return [
        shlex.split(line.strip()[len(prefix) :])
        for line in text.splitlines()
        if line.strip().startswith(prefix)
    ]


def test_the_docstrings_command_is_accepted() -> None:
    commands = _shown_commands()
    assert commands, "the docstring shows how to run the tool"
    register_configs()
    for overrides in commands:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        run = load_config(cfg)  # raises ConfigError for a refused combination
        assert run.task.env == "rltrain.tasks.python_tool:PythonEnv"
        assert env_problems(run) == [], overrides
