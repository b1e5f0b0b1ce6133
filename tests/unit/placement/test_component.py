"""ComponentPlacement, HybridComponentPlacement and ModelParallelComponentPlacement."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from placement_helpers import make_cluster

from rltrain.config.schema import RunConfig
from rltrain.errors import PlacementError
from rltrain.placement import (
    ComponentPlacement,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    PackedPlacementStrategy,
    PlacementMode,
)
from rltrain.placement.types import NodeGroup


def rlinf(placement: dict, **sections) -> dict:
    """An RLinf-style config: cluster.component_placement plus component sections."""
    return {"cluster": {"component_placement": placement}, **sections}


def devs(cp: ComponentPlacement, name: str) -> list[tuple[int, tuple[int, ...]]]:
    return [(p.cluster_node_rank, p.device_ids) for p in cp.get_placements(name)]


def test_seed_collocated_example_two_nodes(two_nodes):
    # seed 001: two nodes of 8 GPUs, "actor,rollout: all  # or 0-15"
    for text in ("all", "0-15"):
        cp = ModelParallelComponentPlacement(rlinf({"actor,rollout": text}), two_nodes)
        assert cp.components == ["actor", "rollout"]
        assert cp.placement_mode is PlacementMode.COLLOCATED
        assert cp.get_world_size("actor") == cp.get_world_size("rollout") == 16
        assert devs(cp, "rollout")[9] == (1, (1,))
        assert cp.get_hardware_ranks("actor") == list(range(16))


def test_seed_hybrid_example(node8):
    # seed 000: actor 0-7, env 0-3, rollout 4-7
    cfg = OmegaConf.create(rlinf({"actor": "0-7", "env": "0-3", "rollout": "4-7"}))
    cp = HybridComponentPlacement(cfg, node8)
    assert cp.placement_mode is PlacementMode.HYBRID
    assert [cp.get_world_size(c) for c in ("actor", "env", "rollout")] == [8, 4, 4]
    assert devs(cp, "rollout") == [(0, (4,)), (0, (5,)), (0, (6,)), (0, (7,))]


def test_disaggregated_is_detected(node8):
    cp = ComponentPlacement(rlinf({"actor": "0-3", "rollout": "4-5", "inference": "6-7"}), node8)
    assert cp.placement_mode is PlacementMode.DISAGGREGATED


def test_node_only_components_do_not_change_the_mode(node8):
    cp = ComponentPlacement(
        rlinf({"actor,rollout": "all", "reward": {"node_group": "node", "placement": "0"}}), node8
    )
    assert cp.placement_mode is PlacementMode.COLLOCATED
    assert cp.get_placements("reward")[0].device_ids == ()


def test_rltrain_run_config_and_plain_dict_are_accepted(node8):
    run = RunConfig()
    run.placement.component_placement = {"actor": "0-3", "rollout": "4-7"}
    run.placement.isolate_accelerator = False
    cp = ComponentPlacement(run, node8)
    assert cp.get_world_size("rollout") == 4
    assert cp.get_placements("actor")[0].visible_accelerators == tuple(map(str, range(8)))
    as_dict = {"placement": {"component_placement": {"actor": "0-3"}}}
    assert ComponentPlacement(as_dict, node8).get_world_size("actor") == 4


def test_cluster_config_section_is_accepted_instead_of_a_spec():
    cp = ComponentPlacement(rlinf({"actor": "all"}), {"num_nodes": 2, "devices_per_node": [1, 3]})
    assert devs(cp, "actor") == [(0, (0,)), (1, (0,)), (1, (1,)), (1, (2,))]


def test_seed_heterogeneous_example():
    # seed 002: actor on a800, rollout on 4090, env on robots 0-3 with 2 processes each,
    # agent on nodes 0-1 for processes 0-200 and nodes 2-3 for 201-511.
    groups = (
        NodeGroup("a800", (0,)),
        NodeGroup("4090", (1,)),
        NodeGroup("robot", (2, 3), hardware_type="robot", hardware_count=2),
    )
    cluster = make_cluster([8, 8, 0, 0], groups=groups)
    cfg = rlinf(
        {
            "actor": {"node_group": "a800", "placement": "0-7"},
            "rollout": {"node_group": "4090", "placement": "0-7"},
            "env": {"node_group": "robot", "placement": "0-3:0-7"},
            "agent": {"node_group": "node", "placement": "0-1:0-200,2-3:201-511"},
        }
    )
    cp = HybridComponentPlacement(cfg, cluster)
    assert {p.cluster_node_rank for p in cp.get_placements("actor")} == {0}
    assert {p.cluster_node_rank for p in cp.get_placements("rollout")} == {1}
    env = cp.get_placements("env")
    assert [(p.cluster_node_rank, p.local_hardware_ranks) for p in env] == [
        (2, (0,)),
        (2, (0,)),
        (2, (1,)),
        (2, (1,)),
        (3, (0,)),
        (3, (0,)),
        (3, (1,)),
        (3, (1,)),
    ]
    assert cp.get_world_size("agent") == 512
    assert cp.placement_mode is PlacementMode.DISAGGREGATED


def test_node_groups_as_yaml_list_in_descending_node_order():
    groups = (NodeGroup("hi", (3, 2)), NodeGroup("lo", (0, 1)))
    cluster = make_cluster(2, num_nodes=4, groups=groups)
    cfg = OmegaConf.create(rlinf({"actor": {"node_group": ["hi", "lo"], "placement": "0-7:0-3"}}))
    cp = ComponentPlacement(cfg, cluster)
    assert devs(cp, "actor") == [(3, (0, 1)), (2, (0, 1)), (0, (0, 1)), (1, (0, 1))]


def test_unknown_component_and_missing_config(node8):
    cp = ComponentPlacement(rlinf({"actor": "all"}), node8)
    with pytest.raises(PlacementError, match="'critic' is not placed.*places \\['actor'\\]"):
        cp.get_world_size("critic")
    with pytest.raises(PlacementError, match="no component placement"):
        ComponentPlacement({"cluster": {}}, node8)


def test_grammar_errors_name_the_config_key(node8):
    with pytest.raises(
        PlacementError, match=r"^cluster.component_placement\['actor,rollout'\]='0-8'"
    ):
        ComponentPlacement(rlinf({"actor,rollout": "0-8"}), node8)
    ours = {"placement": {"component_placement": {"actor": " 0-1 , 1-2 ,"}}}
    with pytest.raises(
        PlacementError, match=r"^placement.component_placement\['actor'\]=' 0-1 , 1-2 ,'"
    ):
        ComponentPlacement(ours, node8)
    with pytest.raises(PlacementError, match="node group 'h100' is not defined"):
        ComponentPlacement(rlinf({"actor": {"node_group": "h100", "placement": "0"}}), node8)


# ----------------------------------------------------------------- model-parallel specifics
def mp(
    placement: dict, cluster, actor_tp=1, rollout_tp=1, **extra
) -> ModelParallelComponentPlacement:
    cfg = rlinf(
        placement,
        actor={"tensor_parallel_size": actor_tp},
        rollout={"tensor_parallel_size": rollout_tp},
        **extra,
    )
    return ModelParallelComponentPlacement(cfg, cluster)


def test_collocated_rollout_is_strided_over_actor_tp_groups(node8):
    cp = mp({"actor,rollout": "all"}, node8, actor_tp=4, rollout_tp=2)
    # world size = engines, not devices: 8 devices / TP 2 = 4 processes
    assert cp.get_world_size("rollout") == 4
    # stride actor_tp / rollout_tp = 2 inside each block of 4 devices
    assert devs(cp, "rollout") == [(0, (0, 2)), (0, (1, 3)), (0, (4, 6)), (0, (5, 7))]
    strategy = cp.get_strategy("rollout")
    assert isinstance(strategy, PackedPlacementStrategy) and strategy.stride == 2
    # every actor rank feeds the rollout engine on its own device
    assert cp.rollout_rank_map() == {
        0: (0,),
        1: (1,),
        2: (0,),
        3: (1,),
        4: (2,),
        5: (3,),
        6: (2,),
        7: (3,),
    }


def test_collocated_equal_tp_is_contiguous(node8):
    cp = mp({"actor,rollout": "all"}, node8, actor_tp=2, rollout_tp=2)
    assert devs(cp, "rollout") == [(0, (0, 1)), (0, (2, 3)), (0, (4, 5)), (0, (6, 7))]
    assert cp.rollout_rank_map()[3] == (1,)


def test_disaggregated_rank_map_spreads_engines_over_actor_replicas(node8):
    cp = mp({"actor": "0-3", "rollout": "4-7"}, node8, actor_tp=2, rollout_tp=2)
    assert cp.placement_mode is PlacementMode.DISAGGREGATED
    assert cp.get_world_size("rollout") == 2
    assert devs(cp, "rollout") == [(0, (4, 5)), (0, (6, 7))]
    # actor dp = 4 / 2 = 2 replicas: engine 0 from replica 0 (ranks 0,1), engine 1 from 1 (2,3)
    assert cp.rollout_rank_map() == {0: (0,), 1: (0,), 2: (1,), 3: (1,)}


def test_hybrid_rollout_inside_actor_devices_is_fed_on_device(node8):
    cp = mp({"actor": "all", "rollout": "6-7"}, node8)
    assert cp.placement_mode is PlacementMode.HYBRID
    assert cp.rollout_rank_map() == {0: (), 1: (), 2: (), 3: (), 4: (), 5: (), 6: (0,), 7: (1,)}


def test_rollout_engines_never_straddle_nodes(two_nodes):
    with pytest.raises(PlacementError) as err:
        mp({"actor": "0-3", "rollout": "6-9"}, two_nodes, rollout_tp=4)
    assert str(err.value) == (
        "cluster.component_placement['rollout']='6-9': rollout.tensor_parallel_size * "
        "pipeline_parallel_size = 4 groups the rollout's devices into engines of 4, but engine 0 "
        "would straddle nodes [0, 1] (node 0 device 6, node 0 device 7, node 1 device 0, node 1 "
        "device 1), and one engine runs on one node: place the rollout so every node's share is "
        "a multiple of 4 devices starting at a node boundary (cluster.devices_per_node a "
        "multiple of 4), or lower rollout.tensor_parallel_size"
    )


@pytest.mark.parametrize(
    ("placement", "kw", "needle"),
    [
        (
            {"actor,rollout": "all"},
            {"rollout_tp": 3},
            "not a multiple of rollout.tensor_parallel_size",
        ),
        ({"actor,rollout": "all"}, {"actor_tp": 3}, "actor.tensor_parallel_size"),
        (
            {"actor,rollout": "0-5"},
            {"actor_tp": 3, "rollout_tp": 2},
            "multiple of rollout.tensor_parallel_size (2)",
        ),
        ({"actor": "0-3", "rollout": "4,6"}, {"rollout_tp": 2}, "contiguous range"),
        ({"actor": "0-3", "rollout": "4-7:0-1"}, {"rollout_tp": 1}, "give each rollout process 1"),
        ({"actor": "0-7:0-3", "rollout": "4-7"}, {}, "one process per device"),
        # reference and critic workers compute on their first device only
        (
            {"actor,rollout": "all", "reference": "0-3:0"},
            {},
            "ranks [0] hold 4 devices each: give each process one device, e.g. "
            "cluster.component_placement.reference=0-3 for one process per device",
        ),
        ({"actor,rollout": "all", "critic": "0-7:0-3"}, {}, "a critic process computes on one"),
        ({"actor": "0-3"}, {}, "must place 'rollout'"),
    ],
)
def test_model_parallel_errors(node8, placement, kw, needle):
    with pytest.raises(PlacementError) as err:
        mp(placement, node8, **kw)
    assert needle in str(err.value)


# --------------------------------------------------- modes of model-parallel layouts (RLinf's)
@pytest.mark.parametrize(
    ("placement", "mode"),
    [
        # a reward or reference on the rollout's devices does not make a layout hybrid
        ({"actor": "0-3", "rollout": "4-7", "reward": "4-7"}, PlacementMode.DISAGGREGATED),
        (
            {"actor": "0-3", "rollout": "4-7", "reward": "4-7", "reference": "4-7"},
            PlacementMode.DISAGGREGATED,
        ),
        ({"actor": "0-3", "rollout": "4-5", "inference": "6-7"}, PlacementMode.DISAGGREGATED),
        ({"actor,rollout": "all", "reward": "0", "reference": "0-3"}, PlacementMode.COLLOCATED),
        ({"actor,rollout,critic": "all"}, PlacementMode.COLLOCATED),
        # RLinf refuses these partial overlaps; rltrain runs them and calls them hybrid
        ({"actor": "0-5", "rollout": "4-7"}, PlacementMode.HYBRID),
        ({"actor": "all", "rollout": "6-7"}, PlacementMode.HYBRID),
        # the critic counts: sharing the actor's devices is not disaggregated
        ({"actor": "0-3", "rollout": "4-7", "critic": "0-3"}, PlacementMode.HYBRID),
        ({"actor": "0-3", "rollout": "4-5", "inference": "4-7"}, PlacementMode.HYBRID),
        # collocated means every mode component on the same devices: a critic or inference
        # beside a shared actor and rollout makes some share and some not
        ({"actor,rollout": "0-3", "critic": "4-7"}, PlacementMode.HYBRID),
        ({"actor,rollout": "0-3", "inference": "4-7"}, PlacementMode.HYBRID),
        ({"actor": "0-3", "rollout": "4-7", "critic": "0-7"}, PlacementMode.HYBRID),
        (
            {"actor": "0-1", "rollout": "2-3", "critic": "4-5", "inference": "6-7"},
            PlacementMode.DISAGGREGATED,
        ),
    ],
)
def test_model_parallel_mode_is_rlinfs(node8, placement, mode):
    assert mp(placement, node8).placement_mode is mode


def test_other_layouts_name_their_mode_from_every_components_devices(node8):
    # HybridComponentPlacement (embodied runs) keeps the device rule: reward shares 4-7
    cp = HybridComponentPlacement(rlinf({"actor": "0-3", "rollout": "4-7", "reward": "4-7"}), node8)
    assert cp.placement_mode is PlacementMode.HYBRID


def test_inference_beside_a_collocated_actor_and_rollout_is_planned(node8):
    # RLinf asserts inference away in a collocated layout; rltrain plans what it is given, and
    # calls it hybrid: actor and rollout share devices, the inference has its own.
    cp = mp({"actor,rollout": "0-3", "inference": "4-7"}, node8)
    assert cp.placement_mode is PlacementMode.HYBRID
    assert cp.get_world_size("inference") == 4


def test_reference_and_critic_with_one_device_per_process_or_shared_devices_are_accepted(node8):
    cp = mp({"actor,rollout": "all", "reference": "0-3", "critic": "4-5:0-3"}, node8)
    assert cp.devices_per_process("reference") == [1, 1, 1, 1]
    assert cp.devices_per_process("critic") == [1, 1, 1, 1]
