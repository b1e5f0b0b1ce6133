"""Pure parts of the runtime (no Ray): node ranks, spec discovery, bundles, trace JSON.

They live beside the integration tests they support; nothing here starts Ray.
"""

from __future__ import annotations

import pytest

from rltrain.errors import ConfigError, PlacementError, ResourceError
from rltrain.placement.types import GIB, ClusterSpec, NodeGroup, NodeSpec, Placement
from rltrain.scheduler.discovery import (
    GROUP_LABEL,
    MEMORY_LABEL,
    RANK_LABEL,
    DiscoveredNode,
    build_spec,
    match_node_groups,
    order_nodes,
)
from rltrain.scheduler.resources import Bundle, plan_reservation
from rltrain.telemetry.trace import Span, to_chrome_trace


def entry(node_id, ip, head=False, cpus=2.0, gpus=0, real=False, labels=None, alive=True):
    res = {"CPU": cpus, "memory": 1e9}
    if gpus:
        res["GPU"] = float(gpus)
    if real:
        res["accelerator_type:H100"] = 1.0
    if head:
        res["node:__internal_head__"] = 1.0
    return {
        "NodeID": node_id,
        "NodeManagerAddress": ip,
        "Alive": alive,
        "Resources": res,
        "Labels": labels or {},
    }


def nodes(*entries):
    return [DiscoveredNode.from_ray(e) for e in entries]


def test_head_first_then_numeric_ip_order():
    ns = nodes(entry("c", "10.0.0.9"), entry("h", "10.0.0.10", head=True), entry("b", "10.0.0.2"))
    assert [n.node_id for n in order_nodes(ns, "head_first")] == ["h", "b", "c"]
    assert [n.node_id for n in order_nodes(ns, "ip")] == ["b", "c", "h"]


def test_label_order_and_its_errors():
    ns = nodes(
        entry("a", "10.0.0.1", labels={RANK_LABEL: "1"}),
        entry("b", "10.0.0.2", labels={RANK_LABEL: "0"}),
    )
    assert [n.node_id for n in order_nodes(ns, "label")] == ["b", "a"]
    dup = nodes(
        entry("a", "1.1.1.1", labels={RANK_LABEL: "0"}),
        entry("b", "1.1.1.2", labels={RANK_LABEL: "0"}),
    )
    with pytest.raises(ConfigError, match="both have rltrain.io/node-rank=0"):
        order_nodes(dup, "label")
    with pytest.raises(ConfigError, match="has rltrain.io/node-rank=None"):
        order_nodes(nodes(entry("a", "1.1.1.1")), "label")
    with pytest.raises(ConfigError, match="cluster.node_order='random' is not valid"):
        order_nodes(ns, "random")


def test_build_spec_devices_memory_and_limits():
    entries = [
        entry("w", "10.0.0.2", gpus=8, real=True, cpus=64),
        entry("h", "10.0.0.1", head=True, gpus=2, labels={MEMORY_LABEL: "1.5"}, cpus=4),
        entry("cpu", "10.0.0.3", cpus=8),
        entry("dead", "10.0.0.4", gpus=8, alive=False),
    ]
    cfg = {"num_nodes": 3, "device_memory_gib": None, "cpus_per_node": 16}
    spec = build_spec(entries, cfg, device_memory_bytes={"w": 80 * GIB})
    assert [(n.rank, n.ray_node_id, n.num_devices, n.accelerator_type) for n in spec.nodes] == [
        (0, "h", 2, "sim"),
        (1, "w", 8, "cuda"),
        (2, "cpu", 0, "none"),
    ]
    assert [n.device_memory_bytes for n in spec.nodes] == [int(1.5 * GIB), 80 * GIB, 4 * GIB]
    assert [n.num_cpus for n in spec.nodes] == [4.0, 16.0, 8.0]  # capped by cpus_per_node
    # a configured value caps the measured GPUs and sizes the simulated ones without a label
    capped = build_spec(entries, {**cfg, "device_memory_gib": 40.0}, {"w": 80 * GIB})
    assert [n.device_memory_bytes for n in capped.nodes] == [int(1.5 * GIB), 40 * GIB, 40 * GIB]
    assert build_spec(entries, {"num_nodes": 1}).num_nodes == 1  # the first num_nodes only
    with pytest.raises(ResourceError, match="cluster.num_nodes=4 but the Ray cluster has 3 alive"):
        build_spec(entries, {"num_nodes": 4})


def test_node_groups_from_config_and_labels():
    ranked = nodes(
        entry("h", "10.0.0.1", head=True, labels={GROUP_LABEL: "a800"}),
        entry("w", "10.0.0.2", labels={GROUP_LABEL: "a800,robot"}),
    )
    configured = (NodeGroup("a800", (0, 1)),)
    assert match_node_groups(configured, ranked) == (
        NodeGroup("a800", (0, 1)),
        NodeGroup("robot", (1,)),
    )
    with pytest.raises(ConfigError, match="lists nodes \\[1\\] but the nodes labelled"):
        match_node_groups((NodeGroup("a800", (1,)),), ranked)
    spec = build_spec(
        [entry("h", "10.0.0.1", head=True), entry("w", "10.0.0.2")],
        {"num_nodes": 2, "node_groups": [{"label": "trainers", "node_ranks": "1"}]},
    )
    assert spec.group("trainers").node_ranks == (1,)


def place(rank, node, devices, local_rank=0, local_world=1):
    accel = "sim" if devices else "none"
    return Placement(
        rank,
        node,
        0,
        devices[0] if devices else -1,
        accel,
        local_rank,
        local_world,
        tuple(map(str, devices)),
        True,
        tuple(devices),
    )


SPEC = ClusterSpec(nodes=(NodeSpec(0, 2, num_cpus=2.0), NodeSpec(1, 2, num_cpus=4.0)))


def test_collocated_layout_shares_bundles_and_threads():
    layout = plan_reservation(
        {
            "actor": [place(0, 0, [0], 0, 2), place(1, 0, [1], 1, 2)],
            "rollout": [place(0, 0, [0], 0, 2), place(1, 0, [1], 1, 2)],
            "reward": [place(0, 0, [])],
        },
        SPEC,
    )
    # Whole node used: 2 CPUs over 3 bundles, rounded down to Ray's 1e-4 unit.
    assert layout.bundles == (
        Bundle(0, 0, 0.6666),
        Bundle(0, 1, 0.6666),
        Bundle(0, None, 0.6666),
    )
    assert layout.bundles[0].resources() == {"CPU": 0.6666, "GPU": 1.0}
    actor0, rollout1, reward = (
        layout.slot("actor", 0),
        layout.slot("rollout", 1),
        layout.slot("reward", 0),
    )
    assert (actor0.bundle_index, actor0.cpus, actor0.num_threads) == (0, 0.3333, 1)
    assert (rollout1.bundle_index, rollout1.cpus, rollout1.num_threads) == (1, 0.3333, 1)
    assert (reward.bundle_index, reward.cpus, reward.num_threads) == (2, 0.6666, 2)
    with pytest.raises(PlacementError, match="'critic' rank 0 is not part of this reservation"):
        layout.slot("critic", 0)


def test_tp2_rollout_beside_tp1_actors_and_half_node_jobs():
    layout = plan_reservation(
        {
            "actor": [place(0, 1, [0], 0, 2), place(1, 1, [1], 1, 2)],
            "rollout": [place(0, 1, [0, 1])],  # one engine over both devices
        },
        SPEC,
    )
    # Node 1: 4 CPUs, both devices used -> 2 CPUs per device bundle.
    assert layout.bundles == (Bundle(1, 0, 2.0), Bundle(1, 1, 2.0))
    assert layout.device_bundles() == {(1, 0): 0, (1, 1): 1}
    assert [(s.component, s.bundle_index, s.cpus, s.num_threads) for s in layout.slots] == [
        ("actor", 0, 1.0, 2),
        ("actor", 1, 2.0, 2),
        ("rollout", 0, 1.0, 4),
    ]
    # A job on one of node 0's two devices takes half its cores, so a second one fits beside it.
    half = plan_reservation({"w": [place(0, 0, [1])], "env": [place(0, 0, [])]}, SPEC)
    assert half.bundles == (Bundle(0, 1, 0.5), Bundle(0, None, 0.5))
    assert half.node_cpus(0) == 1.0


def test_layout_rejects_missing_nodes_and_devices():
    with pytest.raises(PlacementError, match="placed on node 3, but the cluster has nodes 0-1"):
        plan_reservation({"actor": [place(0, 3, [0])]}, SPEC)
    with pytest.raises(PlacementError, match="uses devices \\[2\\] on node 0"):
        plan_reservation({"actor": [place(0, 0, [2])]}, SPEC)


def test_chrome_trace_lanes():
    spans = [
        Span("generate", "rollout", ("node0/dev0", "node0/dev1"), "rollout[0]", 10.0, 5.0, 1),
        Span("train", "actor", ("node0/dev0",), "actor[0]", 20.0, 3.0, 2),
        Span("step", "driver", (), "driver", 0.0, 30.0, 3),
    ]
    doc = to_chrome_trace(spans)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {
        1: "device node0/dev0",
        2: "device node0/dev1",
        3: "process actor[0]",
        4: "process driver",
        5: "process rollout[0]",
    }
    complete = sorted((e["pid"], e["name"]) for e in doc["traceEvents"] if e["ph"] == "X")
    assert complete == [
        (1, "generate"),
        (1, "train"),
        (2, "generate"),
        (3, "train"),
        (4, "step"),
        (5, "generate"),
    ]


def test_components_that_overlap_share_the_cores_for_threads():
    # Node 1: 4 CPUs. Taking turns, actor (1 process) and rollout (1 process) get 4 threads
    # each; overlapping (asynchronous rollout) they run at once and get 4 // 2 = 2 each.
    placements = {"actor": [place(0, 1, [0])], "rollout": [place(0, 1, [1])]}
    turns = plan_reservation(placements, SPEC)
    both = plan_reservation(placements, SPEC, overlap=[frozenset({"actor", "rollout"})])
    assert [s.num_threads for s in turns.slots] == [4, 4]
    assert [s.num_threads for s in both.slots] == [2, 2]
    assert both.bundles == turns.bundles  # only threads change, not what Ray reserves
