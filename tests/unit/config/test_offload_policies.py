"""Offload policies that would move nothing, or not what they say, are refused when the config
loads (before Ray), each naming the key and the fix."""

from __future__ import annotations

import pytest
from composed import composed_run

from rltrain.config.numerics import device_placement_keys
from rltrain.config.offload import held_states
from rltrain.errors import ConfigError


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        composed_run(*overrides)
    return info.value.problems


def test_the_reviewers_three_useless_policies_are_each_refused():
    found = problems(
        "placement=hybrid",
        "placement.offload.rollout.states=[optimizer]",
        "placement.offload.actor.states=[kv_cache]",
        "+placement.offload.reference={when: after_stage}",
    )
    text = " | ".join(found)
    assert "placement.offload.actor names state kinds ['kv_cache'] that actor does not hold" in text
    assert "placement.offload.rollout names state kinds ['optimizer']" in text
    assert "placement.offload.reference={when: after_stage" in text
    assert "reference is not placed" in text and "drop placement.offload.reference" in text
    assert len(found) == 3


def test_a_policy_that_moves_nothing_is_refused():
    # the torch engine frees its KV cache after every generate: a kv_cache-only policy is idle
    (msg,) = problems("placement=collocated", "placement.offload.rollout.states=[kv_cache]")
    assert "placement.offload.rollout={when: on_demand, states: ['kv_cache']} moves nothing" in msg
    assert "list ['weights'] in placement.offload.rollout.states" in msg
    (msg,) = problems("placement=collocated", "placement.offload.actor.states=[]")
    assert "placement.offload.actor={when: on_demand, states: []} moves nothing" in msg


def test_vllm_kv_cache_without_weights_is_refused():
    # RLinf's offload_weight=false on the shipped rollout policy leaves states={kv_cache}; vLLM
    # frees its cache only by sleeping, which takes the weights too.
    found = problems(
        "placement=collocated",
        "rollout.backend=vllm",
        "cluster=ray",  # GPUs are only known once Ray reports them: no CUDA refusal here
        "placement.offload.rollout.offload_weight=false",
    )
    (msg,) = [p for p in found if p.startswith("placement.offload.rollout")]
    assert "states: ['kv_cache']} with rollout.backend='vllm'" in msg
    assert "placement.offload.rollout.offload_weight=true" in msg


def test_shipped_policies_and_the_default_states_are_accepted():
    composed_run("placement=collocated", "rollout.backend=vllm", "cluster=ray")
    composed_run("placement=hybrid", "placement.offload.rollout.offload_weight=true")
    # `states` left at its default (every kind) means "whatever the component holds"
    composed_run("placement=collocated", "+placement.offload.reward={when: never}")
    run = composed_run(
        "placement=collocated",
        "+placement.component_placement.reference=all",
        "+placement.offload.reference={when: after_stage}",
    )
    assert held_states(run, "reference") == (frozenset({"weights"}), frozenset({"weights"}))
    assert held_states(run, "env") == (frozenset(), frozenset())  # a CPU simulator holds none


def test_kv_cache_is_movable_state_only_for_a_reserved_engine():
    torch_run = composed_run("placement=collocated")
    vllm_run = composed_run("placement=collocated", "rollout.backend=vllm", "cluster=ray")
    both = frozenset({"weights", "kv_cache"})
    assert held_states(torch_run, "rollout") == (both, frozenset({"weights"}))
    assert held_states(vllm_run, "rollout") == (both, both)


GROUPS = (
    "cluster.num_nodes=2",
    "cluster.devices_per_node=[2, 0]",
    '+cluster.node_groups=[{label: g, node_ranks: "0"}, {label: cpu, node_ranks: "1"}, '
    '{label: arm, node_ranks: "0", hardware: {type: robot, count: 2}}]',
)


def test_a_policy_for_a_component_on_an_accelerator_node_group_is_accepted():
    # node group g holds node 0's two devices: the shipped policies move real device memory
    run = composed_run(
        *GROUPS,
        'placement.component_placement.actor={node_group: g, placement: "0-1"}',
        'placement.component_placement.rollout={node_group: g, placement: "0-1"}',
    )
    assert run.placement.offload["actor"].when == "on_demand"
    assert device_placement_keys(run) == ["actor", "rollout"]


@pytest.mark.parametrize("group", ["node", "cpu", "arm"])
def test_a_policy_for_a_component_on_nodes_or_hardware_only_is_refused(group):
    # the reserved node group, a group of device-less nodes and a hardware group count nodes or
    # robots, not devices
    (msg,) = problems(
        *GROUPS,
        f'+placement.component_placement.reference={{node_group: {group}, placement: "0"}}',
        "+placement.offload.reference={when: after_stage}",
        "algorithm.kl_coef=0.05",
    )
    assert msg.startswith("placement.offload.reference={when: after_stage")
    assert "reference is placed on nodes only and holds no device memory" in msg
