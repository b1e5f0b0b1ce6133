"""A ``trainer.resume=auto`` run config for the reliability tests."""

from __future__ import annotations

from rltrain.config import load_config
from rltrain.config.schema import RunConfig


def auto_run() -> RunConfig:
    return load_config(
        {
            "placement": {"component_placement": {"actor": "all", "rollout": "all"}},
            "trainer": {"resume": "auto"},
        }
    )
