"""``key={}`` on the command line empties a mapping, and overrides apply in command-line order:
what a later override sets inside the emptied mapping holds (no Ray)."""

from __future__ import annotations

import pathlib

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config import load_config
from rltrain.config.overrides import apply_empty_mappings
from rltrain.config.store import register_configs

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"
ACTOR = "placement.offload.actor={when: after_stage, states: [grads, optimizer, weights]}"


def composed(*overrides: str):
    """The run's config: Hydra's composition, then the command line's empty mappings."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    apply_empty_mappings(cfg, overrides)
    return load_config(cfg)


def test_a_policy_given_after_the_empty_mapping_is_the_only_one():
    offload = composed("placement.offload={}", ACTOR).placement.offload
    assert set(offload) == {"actor"}
    assert offload["actor"].when == "after_stage"
    assert list(offload["actor"].states) == ["grads", "optimizer", "weights"]


def test_a_key_inside_an_emptied_policy_given_after_it_is_set():
    offload = composed("placement.offload={}", "placement.offload.rollout.when=never")
    assert set(offload.placement.offload) == {"rollout"}
    assert offload.placement.offload["rollout"].when == "never"


def test_a_policy_given_before_the_empty_mapping_is_emptied_with_it():
    assert composed(ACTOR, "placement.offload={}").placement.offload == {}


def test_a_null_after_the_empty_mapping_clears_what_was_set_between():
    run = composed("placement.offload={}", ACTOR, "placement.offload.actor=null")
    assert not run.placement.offload.get("actor")


def test_cfg_says_where_it_shows_another_mapping_than_the_run_gets():
    from rltrain.__main__ import shown_config_notes

    (note,) = shown_config_notes(
        ["--cfg", "job", "model=qwen2_0_5b", "placement.offload={}", ACTOR]
    )
    assert note.startswith("--cfg shows placement.offload as Hydra merges placement.offload={}")
    assert "the run empties placement.offload" in note
    assert shown_config_notes(["--cfg", "job", ACTOR]) == []
