"""The tool pool's fixed asks in the Ray reservation: each tool worker asks exactly
``tools.cpus_per_worker`` CPUs and ``tools.memory_gib_per_worker`` of memory inside its node's
CPU bundle, which holds them plus the equal parts of the other node-only processes; the plan
refuses, before Ray, what the reservation could not hold. Values hand-computed below."""

from __future__ import annotations

import pytest

from rltrain.config.schema import RunConfig
from rltrain.errors import ResourceError
from rltrain.placement.plan import build_plan
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec, Placement
from rltrain.scheduler.resources import ProcessAsk, plan_reservation, tool_asks

MIB = 2**20


def cluster() -> ClusterSpec:
    """Node 0: 2 CPUs, 2 devices; node 1: 4 CPUs, CPU only."""
    return ClusterSpec((NodeSpec(0, 2, num_cpus=2.0), NodeSpec(1, 0, "none", num_cpus=4.0)))


def place(rank: int, node: int, device: int | None = None) -> Placement:
    """A process on ``device`` of node 0, or (None) on ``node`` without a device."""
    accel = "sim" if device is not None else "none"
    hw = (device,) if device is not None else ()
    return Placement(rank, node, node, hw[0] if hw else 0, accel, rank, 1, (), True, hw)


def on_node(node: int, rank: int) -> Placement:
    return place(rank, node)


def on_device(device: int) -> Placement:
    return place(device, 0, device)


def test_tool_workers_ask_exactly_their_keys_and_their_node_bundle_holds_them():
    placements = {
        "actor": [on_device(0), on_device(1)],
        "reward": [on_node(0, 0)],
        "tools": [on_node(0, 0), on_node(0, 1), on_node(1, 2), on_node(1, 3)],
    }
    layout = plan_reservation(placements, cluster(), asks={"tools": ProcessAsk(0.5, 512 * MIB)})
    # node 0: the job's share 2 CPUs; tools 2 x 0.5 = 1 reserved whole; the rest 1 CPU split
    # over 2 device bundles and reward's part: 0.3333 each; node bundle 0.3333 + 1 = 1.3333.
    # node 1 (tools only): 2 x 0.5 = 1 CPU, not the node's 4.
    assert [(b.node_rank, b.device, b.cpus, b.memory_bytes) for b in layout.bundles] == [
        (0, 0, 0.3333, 0),
        (0, 1, 0.3333, 0),
        (0, None, 1.3333, GIB),
        (1, None, 1.0, GIB),
    ]
    assert layout.bundles[2].resources() == {"CPU": 1.3333, "memory": float(GIB)}
    asks = {(s.component, s.rank): (s.bundle_index, s.cpus, s.memory_bytes) for s in layout.slots}
    assert asks == {
        ("actor", 0): (0, 0.3333, 0),
        ("actor", 1): (1, 0.3333, 0),
        ("reward", 0): (2, 0.3333, 0),
        ("tools", 0): (2, 0.5, 512 * MIB),
        ("tools", 1): (2, 0.5, 512 * MIB),
        ("tools", 2): (3, 0.5, 512 * MIB),
        ("tools", 3): (3, 0.5, 512 * MIB),
    }
    assert {s.num_threads for s in layout.slots if s.component == "tools"} == {1}
    assert layout.node_cpus(0) == pytest.approx(1.9999) and layout.node_cpus(1) == 1.0
    # without asks (the old rule) every node-only process takes an equal part of its bundle
    equal = plan_reservation(placements, cluster())
    assert [s.cpus for s in equal.slots if s.component == "tools"] == [0.2222, 0.2222, 2.0, 2.0]


def tool_run(cpus_per_worker: float) -> RunConfig:
    run = RunConfig()
    run.task.env = "rltrain.tasks.calc_tool:CalculatorEnv"
    run.placement.component_placement = {"actor,rollout,reward": "all"}
    run.tools.pool_size, run.tools.cpus_per_worker = 2, cpus_per_worker
    run.cluster.cpus_per_node = 2
    return run


def test_the_plan_and_the_reservation_agree_on_a_shared_node():
    one_node = ClusterSpec((NodeSpec(0, 2, num_cpus=2.0, host_memory_bytes=8 * GIB),))
    plan = build_plan(tool_run(0.75), one_node)
    placements = {c: plan.placements(c) for c in plan.components}
    layout = plan_reservation(placements, one_node, asks=tool_asks(plan.tools))
    tools = [s for s in layout.slots if s.component == "tools"]
    assert [(s.cpus, s.memory_bytes, s.num_threads) for s in tools] == [(0.75, GIB // 2, 1)] * 2
    # the pool's 1.5 CPUs whole, the 0.5 left split over the 2 device bundles
    assert [(b.device, b.cpus) for b in layout.bundles] == [(0, 0.25), (1, 0.25), (None, 1.5)]
    # a pool that takes every CPU of a node shared with the job's other processes: refused
    with pytest.raises(ResourceError, match=r"leaves no CPU of node 0.*tools.cpus_per_worker=1"):
        build_plan(tool_run(1.0), one_node)
