"""Packed, Flexible and Node strategies and the Placement records they produce."""

from __future__ import annotations

import dataclasses

import pytest
from placement_helpers import make_cluster

from rltrain.errors import PlacementError
from rltrain.placement import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
)
from rltrain.placement.resources import make_placements, resource_space
from rltrain.placement.types import NodeGroup, Placement


def devices(placements: list[Placement]) -> list[tuple[int, tuple[int, ...]]]:
    return [(p.cluster_node_rank, p.device_ids) for p in placements]


def test_packed_examples_from_the_seed(node8):
    # "This will run 4 processes on the first node's GPU 0, 1, 2, 3, each using 1 GPU."
    assert devices(PackedPlacementStrategy(0, 3).get_placement(node8)) == [
        (0, (0,)),
        (0, (1,)),
        (0, (2,)),
        (0, (3,)),
    ]
    # num_hardware_per_process=2: "2 processes, each using 2 GPUs (0-1 and 2-3)"
    assert devices(PackedPlacementStrategy(0, 3, 2).get_placement(node8)) == [
        (0, (0, 1)),
        (0, (2, 3)),
    ]
    # stride=2: "2 processes, each using 2 GPUs (0,2 1,3)"
    assert devices(PackedPlacementStrategy(0, 3, 2, stride=2).get_placement(node8)) == [
        (0, (0, 2)),
        (0, (1, 3)),
    ]


def test_packed_spans_nodes_in_whole_processes(two_nodes):
    got = devices(
        PackedPlacementStrategy(4, 11, num_hardware_per_process=4).get_placement(two_nodes)
    )
    assert got == [(0, (4, 5, 6, 7)), (1, (0, 1, 2, 3))]


def test_packed_range_straddling_a_node_boundary_is_an_error(two_nodes):
    # ranks 6-9 would be devices 6,7 of node 0 and 0,1 of node 1: never one process.
    with pytest.raises(PlacementError, match="straddle nodes"):
        PackedPlacementStrategy(6, 9, num_hardware_per_process=4).get_placement(two_nodes)


def test_packed_beyond_the_cluster_is_an_error_not_a_phantom_device(two_nodes):
    with pytest.raises(PlacementError, match="end_hardware_rank=16.*ranks 0-15"):
        PackedPlacementStrategy(15, 16, 2).get_placement(two_nodes)


@pytest.mark.parametrize(
    ("args", "kwargs", "needle"),
    [
        ((0, 4), {"num_hardware_per_process": 2}, "not a positive multiple"),
        ((3, 2), {}, "not a positive multiple"),
        ((-1, 2), {}, "start_hardware_rank=-1"),
        ((0, 3), {"stride": 0}, "stride=0"),
        ((0, 3), {"num_hardware_per_process": True}, "num_hardware_per_process=True"),
    ],
)
def test_packed_parameter_errors(args, kwargs, needle):
    with pytest.raises(PlacementError, match=None) as err:
        PackedPlacementStrategy(*args, **kwargs)
    assert needle in str(err.value)


def test_flexible_example_and_sorting(node8):
    got = FlexiblePlacementStrategy([[0, 1], [2], [3]]).get_placement(node8)
    assert devices(got) == [(0, (0, 1)), (0, (2,)), (0, (3,))]
    assert [p.rank for p in got] == [0, 1, 2]
    # sorted within each process and across processes by the first rank
    assert devices(FlexiblePlacementStrategy([[3], [1, 0]]).get_placement(node8)) == [
        (0, (0, 1)),
        (0, (3,)),
    ]


def test_flexible_errors(two_nodes):
    with pytest.raises(PlacementError, match="without repeats"):
        FlexiblePlacementStrategy([[1, 1]])
    with pytest.raises(PlacementError, match="is empty"):
        FlexiblePlacementStrategy([])
    with pytest.raises(PlacementError, match="straddle nodes"):
        FlexiblePlacementStrategy([[7, 8]]).get_placement(two_nodes)
    with pytest.raises(PlacementError, match="asks for resource 16"):
        FlexiblePlacementStrategy([[16]]).get_placement(two_nodes)


def test_flexible_processes_may_share_a_device(node8):
    got = FlexiblePlacementStrategy([[0], [0]]).get_placement(node8)
    assert [(p.rank, p.device_ids, p.local_rank, p.local_world_size) for p in got] == [
        (0, (0,), 0, 2),
        (1, (0,), 1, 2),
    ]


def test_node_strategy_places_without_devices(two_nodes):
    # "NodePlacementStrategy([0] * 4) ... will run 4 processes on the first node"
    got = NodePlacementStrategy([0] * 4).get_placement(two_nodes)
    assert [(p.cluster_node_rank, p.local_rank, p.local_world_size) for p in got] == [
        (0, 0, 4),
        (0, 1, 4),
        (0, 2, 4),
        (0, 3, 4),
    ]
    # As in RLinf, a node process sees its node's accelerators without reserving any.
    assert all(p.device_ids == () for p in got)
    assert all(p.visible_accelerators == tuple(map(str, range(8))) for p in got)
    assert all(p.local_accelerator_rank == 0 for p in got)
    assert [
        p.cluster_node_rank for p in NodePlacementStrategy([1, 0]).get_placement(two_nodes)
    ] == [0, 1]
    with pytest.raises(PlacementError, match="asks for resource 2"):
        NodePlacementStrategy([2]).get_placement(two_nodes)


def test_placement_record_fields_across_nodes():
    cluster = make_cluster([2, 4])  # devices per node may differ
    got = PackedPlacementStrategy(1, 4).get_placement(cluster)
    assert [
        (
            p.rank,
            p.cluster_node_rank,
            p.placement_node_rank,
            p.local_accelerator_rank,
            p.local_rank,
            p.local_world_size,
            p.visible_accelerators,
        )
        for p in got
    ] == [
        (0, 0, 0, 1, 0, 1, ("1",)),
        (1, 1, 1, 0, 0, 3, ("0",)),
        (2, 1, 1, 1, 1, 3, ("1",)),
        (3, 1, 1, 2, 2, 3, ("2",)),
    ]
    assert all(p.isolate_accelerator and p.accelerator_type == "sim" for p in got)


def test_without_isolation_a_process_sees_every_device_of_its_node(node8):
    (p,) = PackedPlacementStrategy(2, 3, 2).get_placement(node8, isolate_accelerator=False)
    assert p.visible_accelerators == tuple(str(i) for i in range(8))
    assert p.device_ids == (2, 3) and not p.isolate_accelerator


def test_node_groups_concatenate_in_listed_order_even_descending():
    groups = (NodeGroup("a", (2, 3)), NodeGroup("b", (1, 0)))
    cluster = make_cluster(2, num_nodes=4, groups=groups)
    # YAML list and "b,a" string mean the same: b's nodes (1 then 0) first, then a's (2, 3).
    for label in (["b", "a"], "b,a"):
        got = PackedPlacementStrategy(0, 7, node_group=label).get_placement(cluster)
        assert devices(got) == [
            (1, (0,)),
            (1, (1,)),
            (0, (0,)),
            (0, (1,)),
            (2, (0,)),
            (2, (1,)),
            (3, (0,)),
            (3, (1,)),
        ]
        assert [p.node_group_label for p in got] == ["b"] * 4 + ["a"] * 4
        assert [p.placement_node_rank for p in got] == [0, 0, 1, 1, 2, 2, 3, 3]
    got = NodePlacementStrategy([0], node_group_label="b").get_placement(cluster)
    assert got[0].cluster_node_rank == 1


def test_unknown_node_group_is_a_placement_error(node8):
    with pytest.raises(PlacementError, match="node group 'gpu' is not defined"):
        PackedPlacementStrategy(0, 1, node_group="gpu").get_placement(node8)


def test_hardware_groups_count_hardware_not_devices():
    groups = (NodeGroup("robot", (1,), hardware_type="robot", hardware_count=4),)
    cluster = make_cluster(2, num_nodes=2, groups=groups)
    got = FlexiblePlacementStrategy([[0], [1, 2]], "robot").get_placement(cluster)
    assert [(p.cluster_node_rank, p.local_hardware_ranks, p.hardware_type) for p in got] == [
        (1, (0,), "robot"),
        (1, (1, 2), "robot"),
    ]
    # A robot's process sees its node's two devices (a simulator may render there), reserves none.
    assert all(p.device_ids == () and p.visible_accelerators == ("0", "1") for p in got)
    assert all(p.local_accelerator_rank == 0 for p in got)


def test_node_processes_on_a_node_without_devices_see_none():
    cluster = make_cluster([2, 0])
    (p,) = NodePlacementStrategy([1]).get_placement(cluster)
    assert (p.cluster_node_rank, p.visible_accelerators, p.local_accelerator_rank) == (1, (), -1)
    assert p.accelerator_type == "none"


def test_reserved_node_label_counts_nodes(two_nodes):
    space = resource_space(two_nodes, ("node",))
    assert space.node == (0, 1) and set(space.kind) == {"node"}


def test_fast_built_placements_equal_ones_built_by_init(node8):
    # make_placements fills __dict__ directly for speed: it must match the dataclass exactly.
    (p,) = make_placements(node8, resource_space(node8), [(3,)], True, "test")
    names = [f.name for f in dataclasses.fields(Placement)]
    assert sorted(vars(p)) == sorted(names)
    assert p == Placement(**{n: getattr(p, n) for n in names})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.rank = 1
