"""A sweep job admitted onto other cluster nodes than it was planned on reserves there: the
launcher's slice (``RLTRAIN_DEVICE_SLICE``) renumbers the job's nodes. Hand-computed maps."""

from __future__ import annotations

import pytest

from hydra_plugins.rltrain_launcher._slices import SliceAllocator
from rltrain.errors import ConfigError
from rltrain.placement.types import GIB, ClusterSpec, NodeGroup, NodeSpec
from rltrain.scheduler import cluster as cluster_mod
from rltrain.scheduler.discovery import (
    apply_node_map,
    node_permutation,
    slice_node_map,
)


def _spec() -> ClusterSpec:
    nodes = tuple(NodeSpec(r, 2, 4 * GIB, "sim", 2.0, ray_node_id=f"id-{r}") for r in range(3))
    return ClusterSpec(nodes, (NodeGroup("robots", (2, 1)),))


def test_the_slice_of_a_second_concurrent_job_moves_its_node_0_onto_node_1():
    alloc = SliceAllocator({0: 2, 1: 2})
    alloc.allocate({(0, 0), (0, 1)})  # job A holds node 0
    piece = alloc.allocate({(0, 0), (0, 1)})  # job B: same plan
    assert piece is not None
    node_map = slice_node_map(piece.to_json())
    assert node_map == {0: 1}
    spec = apply_node_map(ClusterSpec(_spec().nodes[:2]), node_map)
    # job B's node 0 is Ray's node id-1 (it reserves there); its node 1 is the node left
    assert [(n.rank, n.ray_node_id) for n in spec.nodes] == [(0, "id-1"), (1, "id-0")]


def test_a_job_reads_its_slice_when_it_discovers_the_cluster(monkeypatch):
    entries = [
        {
            "NodeID": f"id-{r}",
            "Alive": True,
            "NodeManagerAddress": f"10.0.0.{r + 1}",
            "Resources": {
                "CPU": 2.0,
                "GPU": 2.0,
                **({"node:__internal_head__": 1.0} if r == 0 else {}),
            },
        }
        for r in range(2)
    ]
    monkeypatch.setenv("RLTRAIN_DEVICE_SLICE", '[{"job":[0,0],"cluster":[1,0]}]')
    spec = cluster_mod.Cluster._spec_from(entries, {"num_nodes": 2})
    assert [n.ray_node_id for n in spec.nodes] == ["id-1", "id-0"]
    monkeypatch.delenv("RLTRAIN_DEVICE_SLICE")
    spec = cluster_mod.Cluster._spec_from(entries, {"num_nodes": 2})
    assert [n.ray_node_id for n in spec.nodes] == ["id-0", "id-1"]


def test_unmapped_nodes_keep_their_rank_or_take_the_lowest_one_left():
    assert node_permutation({}, 3) == [0, 1, 2]
    assert node_permutation({0: 1}, 3) == [1, 0, 2]  # job node 1 lost its rank: takes 0
    assert node_permutation({0: 2, 1: 0}, 3) == [2, 0, 1]
    # job node 2 takes 0; job node 1 keeps 1; job node 0 takes 2, the one left
    assert node_permutation({2: 0}, 3) == [2, 1, 0]


def test_groups_follow_their_nodes_and_identity_keeps_the_spec():
    spec = _spec()
    assert apply_node_map(spec, {0: 0}) is spec
    moved = apply_node_map(spec, {0: 2})  # permutation [2, 1, 0]
    assert [n.ray_node_id for n in moved.nodes] == ["id-2", "id-1", "id-0"]
    assert [n.rank for n in moved.nodes] == [0, 1, 2]
    assert moved.node_groups == (NodeGroup("robots", (0, 1)),)  # cluster 2 is job 0 now


def test_a_bad_slice_is_refused_naming_the_variable():
    with pytest.raises(ConfigError, match="RLTRAIN_DEVICE_SLICE='nope' is not a device slice"):
        slice_node_map("nope")
    two = '[{"job":[0,0],"cluster":[1,0]},{"job":[0,1],"cluster":[2,0]}]'
    with pytest.raises(ConfigError, match="job node 0 is on cluster nodes 1 and 2"):
        slice_node_map(two)
    with pytest.raises(ConfigError, match=r"cluster.num_nodes=2"):
        node_permutation({0: 5}, 2)
    assert slice_node_map("") == {} and slice_node_map("[]") == {}


def test_a_job_node_goes_only_to_a_node_with_its_planned_device_numbers():
    # Node 0 full; node 1 has 2 devices (ids 0-1), node 2 has 4 free: a job planned on
    # devices 2-3 of its node 0 needs device number 3, which node 1 lacks.
    alloc = SliceAllocator({0: 4, 1: 2, 2: 4})
    alloc.allocate({(0, d) for d in range(4)})
    piece = alloc.allocate({(0, 2), (0, 3)})
    assert piece is not None and piece.node_map() == {0: 2}


def test_with_configured_node_groups_a_job_waits_for_its_own_node():
    # a configured group names the job's node ranks: moving node 0 would hand them to node 1
    alloc = SliceAllocator({0: 2, 1: 2}, movable=False)
    first = alloc.allocate([(0, 0), (0, 1)])
    assert first is not None
    assert alloc.allocate([(0, 0), (0, 1)]) is None  # waits; not moved onto node 1
    assert alloc.never_fits([(0, 0), (0, 1)]) is None
    assert alloc.allocate([(1, 0)]) is not None  # its own node 1 is free
    alloc.release(first)
    assert alloc.allocate([(0, 0), (0, 1)]) is not None
