"""A run whose ``placement.fuse=auto`` falls back to separate processes says so at start, with
the blockers (no Ray)."""

from __future__ import annotations

import pathlib

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config import load_config
from rltrain.config.store import register_configs
from rltrain.runners.layout import preflight

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"


def layout_of(*overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return preflight(load_config(compose(config_name="config", overrides=list(overrides))))


def test_a_fallback_from_auto_fusion_is_a_start_up_note_with_its_blockers():
    layout = layout_of("placement.offload.actor.when=after_stage")
    assert not layout.fused and layout.fuse_blockers
    (note,) = [n for n in layout.notes if n.startswith("processes:")]
    assert note == (
        "processes: not fused (placement.fuse=auto), actor, rollout and reward run in processes "
        "of their own: " + "; ".join(layout.fuse_blockers)
    )


def test_a_fused_run_says_nothing_about_fusion():
    layout = layout_of()
    assert layout.fused
    assert not [n for n in layout.notes if n.startswith("processes:")]
