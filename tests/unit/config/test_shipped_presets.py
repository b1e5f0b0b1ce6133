"""What the shipped configs under conf/ promise in their comments holds.

Each placement option and preset comments on how to change it with one override; these tests
compose those overrides on every shipped config that the comment covers.
"""

from __future__ import annotations

import pathlib

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config.schema import OffloadPolicyConfig
from rltrain.config.store import register_configs

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"
#: RLinf's offload spellings, which every shipped policy carries so one override sets them.
ALIASES = ("enable_offload", "offload_weight", "offload_grad", "offload_optimizer")


def _offload_sections() -> list[tuple[str, dict]]:
    """``(file, placement.offload)`` of every shipped config that writes one."""
    found = []
    for path in sorted(CONF.rglob("*.yaml")):
        body = yaml.safe_load(path.read_text()) or {}
        package_global = path.read_text().startswith("# @package _global_")
        placement = body.get("placement") if package_global else body
        if path.parent.name == "placement" or package_global:
            offload = (placement or {}).get("offload") if isinstance(placement, dict) else None
            if offload is not None:
                found.append((str(path.relative_to(CONF)), offload))
    return found


SECTIONS = _offload_sections()


def test_the_shipped_offload_sections_are_found():
    files = {f for f, _ in SECTIONS}
    assert {"placement/collocated.yaml", "experiment/reasoning_ppo.yaml"} <= files
    assert {"experiment/cartpole_hybrid.yaml", "experiment/reasoning_ppo_hybrid.yaml"} <= files


@pytest.mark.parametrize(("where", "offload"), SECTIONS, ids=[f for f, _ in SECTIONS])
def test_every_shipped_policy_holds_rlinf_spellings_unset(where, offload):
    for component, policy in offload.items():
        missing = [a for a in ALIASES if a not in policy]
        assert not missing, f"{where}: placement.offload.{component} lacks {missing}"
        assert all(policy[a] is None for a in ALIASES), f"{where}: {component} sets one"
        assert set(policy) <= {f.name for f in OffloadPolicyConfig.__dataclass_fields__.values()}


def _compose(overrides: list[str]):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize(
    "preset", ["reasoning_ppo", "reasoning_ppo_hybrid", "cartpole_collocated", "cartpole_hybrid"]
)
def test_one_override_sets_an_rlinf_spelling_on_a_preset(preset):
    cfg = _compose([f"experiment={preset}", "placement.offload.actor.offload_weight=true"])
    assert cfg.placement.offload.actor.offload_weight is True


def test_the_disaggregated_ppo_preset_leaves_the_cluster_to_the_command_line():
    from rltrain.config.presets import check_group_choices

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        check_group_choices(
            loader, "config", ["experiment=reasoning_ppo_disaggregated", "cluster=ray"]
        )
    GlobalHydra.instance().clear()
    assert _compose(["experiment=reasoning_ppo_disaggregated"]).cluster.devices_per_node == 2


def test_the_disaggregated_ppo_preset_plans_on_three_devices_and_is_refused_on_two():
    from rltrain.config import load_config
    from rltrain.errors import PlacementError
    from rltrain.runners.layout import preflight

    preset = "experiment=reasoning_ppo_disaggregated"
    layout = preflight(load_config(_compose([preset, "cluster.devices_per_node=3"])))
    assert layout.world_sizes() == {"actor": 1, "critic": 1, "rollout": 1, "reward": 1}
    with pytest.raises(PlacementError, match=r"'rollout'\]='2'.* 2 accelerators"):
        preflight(load_config(_compose([preset])))


def test_the_collocated_comment_s_command_for_moving_the_rollout_plans():
    from rltrain.config import load_config
    from rltrain.runners.layout import preflight

    text = (CONF / "placement" / "collocated.yaml").read_text()
    (line,) = [x for x in text.splitlines() if "component_placement.rollout=" in x]
    overrides = [t.strip("().,") for t in line.lstrip("# ").split() if "=" in t]
    assert "placement.component_placement.rollout=1" in overrides
    layout = preflight(load_config(_compose(overrides)))
    assert layout.world_sizes()["rollout"] == 1 and layout.world_sizes()["actor"] == 2
