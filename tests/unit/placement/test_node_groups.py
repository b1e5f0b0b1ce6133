"""Node groups that would number one device twice are refused, naming the key to fix."""

from __future__ import annotations

import pytest

from rltrain.errors import ConfigError, PlacementError
from rltrain.placement import ComponentPlacement
from rltrain.placement.types import ClusterSpec


def cluster(*groups: dict) -> ClusterSpec:
    return ClusterSpec.from_config(
        {"num_nodes": 2, "devices_per_node": 2, "node_groups": list(groups)}
    )


@pytest.mark.parametrize("ranks", ["0,0", [1, 0, 1], "0-1,1"])
def test_a_node_listed_twice_in_one_group_is_refused(ranks):
    with pytest.raises(ConfigError) as err:
        cluster({"label": "g", "node_ranks": ranks})
    assert f"cluster.node_groups[0].node_ranks={ranks!r} lists nodes" in str(err.value)
    assert "list each node once" in str(err.value)


@pytest.mark.parametrize("count", [0, -1])
def test_a_hardware_count_below_one_is_refused_at_once(count):
    with pytest.raises(ConfigError) as err:
        cluster({"label": "arm", "node_ranks": "0", "hardware": {"type": "robot", "count": count}})
    assert f"cluster.node_groups[0].hardware.count={count}" in str(err.value)


def test_overlapping_groups_listed_together_are_refused_naming_the_component():
    spec = cluster({"label": "a", "node_ranks": "0"}, {"label": "b", "node_ranks": "0,1"})
    config = {
        "placement": {"component_placement": {"actor": {"node_group": "a,b", "placement": "0-1"}}}
    }
    with pytest.raises(PlacementError) as err:
        ComponentPlacement(config, spec)
    msg = str(err.value)
    assert msg.startswith("placement.component_placement['actor']: node_group 'a,b'")
    assert "'a' (cluster.node_groups[0].node_ranks=[0])" in msg
    assert "'b' (cluster.node_groups[1].node_ranks=[0, 1])" in msg
    assert "both hold node 0" in msg


def test_disjoint_groups_listed_together_number_each_device_once():
    spec = cluster({"label": "a", "node_ranks": "1"}, {"label": "b", "node_ranks": "0"})
    config = {
        "placement": {"component_placement": {"actor": {"node_group": "a,b", "placement": "all"}}}
    }
    cp = ComponentPlacement(config, spec)
    # a's node 1 first, then b's node 0
    assert [(p.cluster_node_rank, p.device_ids) for p in cp.get_placements("actor")] == [
        (1, (0,)),
        (1, (1,)),
        (0, (0,)),
        (0, (1,)),
    ]


def test_an_undefined_node_group_names_the_component_key():
    config = {
        "placement": {"component_placement": {"actor": {"node_group": "zz", "placement": "0"}}}
    }
    with pytest.raises(PlacementError) as err:
        ComponentPlacement(config, cluster())
    assert str(err.value).startswith("placement.component_placement['actor']: node group 'zz'")
