"""A group chosen on the command line that the chosen preset also writes is refused.

Presets (``experiment=...``) merge after the config groups, so without this check
``experiment=reasoning_ppo_hybrid placement=collocated`` would run a hybrid placement.
"""

from __future__ import annotations

import pathlib

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config.presets import check_group_choices, overlapping, written_keys
from rltrain.config.store import register_configs
from rltrain.errors import ConfigError

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"


def test_written_keys_are_the_dotted_leaves():
    body = {"placement": {"mode": "hybrid", "offload": {}}, "seed": 3, "env": {"a": {"b": 1}}}
    assert written_keys(body) == ["placement.mode", "placement.offload", "seed", "env.a.b"]
    assert written_keys({"mode": "x"}, "placement") == ["placement.mode"]


def test_overlap_is_inside_the_package_or_above_it():
    keys = ["placement.mode", "placements.x", "whatif", "model.path"]
    assert overlapping("placement", keys) == ["placement.mode"]  # not "placements.x"
    assert overlapping("whatif.devices", keys) == ["whatif"]  # replaces the group's node
    assert overlapping("cluster", keys) == []


@pytest.fixture
def loader():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield GlobalHydra.instance().config_loader()
    GlobalHydra.instance().clear()


@pytest.mark.parametrize(
    ("overrides", "choice", "written"),
    [
        (["experiment=reasoning_ppo_hybrid", "placement=collocated"], "placement=collocated",
         "placement.mode"),
        (["mode=plan", "experiment=reasoning_ppo_hybrid", "placement=disaggregated"],
         "placement=disaggregated", "placement.mode"),
        # algorithm comes from _cartpole, which the preset pulls in through its defaults list
        (["experiment=cartpole_hybrid", "algorithm=rloo"], "algorithm=rloo",
         "algorithm.advantage_estimator"),
        (["experiment=gsm8k_tiny", "model=qwen2_0_5b"], "model=qwen2_0_5b", "model.path"),
        # through a preset's own preset (gsm8k_tool's defaults hold gsm8k_tiny)
        (["model=qwen2_0_5b", "experiment=gsm8k_tool"], "model=qwen2_0_5b", "model.hidden_size"),
        (["experiment=cartpole_hybrid", "placement=disaggregated"], "placement=disaggregated",
         "placement.mode"),
    ],
)  # fmt: skip
def test_a_group_the_preset_writes_is_refused(loader, overrides, choice, written):
    with pytest.raises(ConfigError) as err:
        check_group_choices(loader, "config", overrides)
    text = str(err.value)
    preset = next(o for o in overrides if o.startswith("experiment="))
    assert preset in text and choice in text and written in text
    assert f"drop {choice}" in text and "override single keys" in text


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiment=gsm8k_tiny", "cluster=ray", "mode=plan"],  # the preset writes no cluster.*
        ["experiment=reasoning_ppo", "algorithm=ppo"],  # the option the preset chooses itself
        ["experiment=gsm8k_tiny", "model=tiny_qwen2"],
        ["experiment=cartpole_hybrid", "placement.component_placement.actor=0"],  # a single key
        ["placement=hybrid", "model=tiny_qwen2"],  # no preset
        ["experiment=cartpole_hybrid"],
    ],
)
def test_other_combinations_are_accepted(loader, overrides):
    check_group_choices(loader, "config", overrides)


@pytest.mark.parametrize(
    ("overrides", "choice", "chosen"),
    [
        (["experiment=reasoning_ppo", "algorithm=grpo"], "algorithm=grpo", "algorithm: ppo"),
        (["algorithm=rloo", "experiment=reasoning_ppo_hybrid", "mode=plan"], "algorithm=rloo",
         "algorithm: ppo"),
    ],
)  # fmt: skip
def test_a_group_the_preset_chooses_in_its_defaults_list_is_refused(
    loader, overrides, choice, chosen
):
    # reasoning_ppo writes no algorithm.* key: it chooses algorithm=ppo in its defaults list,
    # and its critic placement is written for that choice
    with pytest.raises(ConfigError) as err:
        check_group_choices(loader, "config", overrides)
    text = str(err.value)
    preset = next(o for o in overrides if o.startswith("experiment="))
    assert f"{preset} chooses {chosen}" in text and f"drop {choice}" in text
    assert "critic" not in text  # not the misleading message of the composed config
