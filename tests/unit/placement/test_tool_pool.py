"""The tool pool in the plan (component ``tools``): placed on the CPU nodes by default, sized
from ``tools.*``, refused when a node cannot hold its workers; nothing of it in a single-turn
run. Values hand-computed from the cluster written here."""

from __future__ import annotations

import pytest
from placement_helpers import compose

from rltrain.errors import PlacementError, ResourceError
from rltrain.placement.export import plan_to_dict
from rltrain.placement.plan import build_plan
from rltrain.placement.render import svg
from rltrain.placement.tools import spread
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec
from rltrain.runners.builders import component_builders
from rltrain.runners.fusion import fusion_blockers
from rltrain.tasks.text_env import env_problems

ENV = "rltrain.tasks.calc_tool:CalculatorEnv"


def gpu_and_two_cpu_nodes() -> ClusterSpec:
    """Node 0: 2 devices; nodes 1 and 2: CPU only. 4 CPUs and 8 GiB of host memory each."""
    return ClusterSpec(
        tuple(
            NodeSpec(r, d, 4 * GIB, "sim" if d else "none", 4.0, 8 * GIB)
            for r, d in enumerate((2, 0, 0))
        )
    )


def agent(**tools: object):
    over = {f"tools.{k}": v for k, v in tools.items()}
    return compose("collocated", **{"task.env": ENV, "cluster.cpus_per_node": 4, **over})


def test_spread_puts_contiguous_runs_of_ranks_on_the_nodes_as_evenly_as_they_allow():
    assert spread(5, (2, 3)) == "2:0-2,3:3-4"
    assert spread(2, (0,)) == "0:0-1"
    assert spread(1, (1, 2)) == "1:0-0"


def test_the_pool_goes_to_the_cpu_nodes_and_is_sized_from_the_tools_keys():
    run = agent(pool_size=3, cpus_per_worker=1.5, memory_gib_per_worker=2)
    plan = build_plan(run, gpu_and_two_cpu_nodes())
    procs = plan.by_component["tools"]
    assert [(p.node_rank, p.devices) for p in procs] == [(1, ()), (1, ()), (2, ())]
    pool = plan.tools
    assert pool is not None and pool.workers == 3
    # node 1: 2 workers x 1.5 CPUs = 3 of 4, 2 x 2 GiB = 4 of 8; node 2: 1.5 CPUs, 2 GiB
    assert [(n.node, n.workers, n.cpus, n.memory_bytes) for n in pool.nodes] == [
        (1, 2, 3.0, 4 * GIB),
        (2, 1, 1.5, 2 * GIB),
    ]
    assert [(n.node_cpus, n.node_memory_bytes) for n in pool.nodes] == [(4.0, 8 * GIB)] * 2
    assert pool.problems() == []
    exported = plan_to_dict(plan)
    assert exported["fits"] and exported["tools"]["nodes"][0]["cpus"] == 3.0
    assert "node 1: 2 worker(s) need 3 of 4 CPUs, 4.00 GiB of 8.00 GiB" in svg(plan)
    assert "tools" in component_builders(run, "reasoning")


def test_without_cpu_nodes_the_pool_spreads_over_every_node():
    cluster = ClusterSpec(tuple(NodeSpec(r, 2, 4 * GIB, "sim", 4.0, 8 * GIB) for r in range(2)))
    plan = build_plan(agent(pool_size=3), cluster)
    assert [p.node_rank for p in plan.by_component["tools"]] == [0, 0, 1]


def test_a_pool_that_does_not_fit_its_nodes_is_refused_naming_the_keys():
    # node 1 gets 3 of 6 workers: 3 x 1.5 = 4.5 CPUs > 4
    with pytest.raises(ResourceError) as cpus:
        build_plan(agent(pool_size=6, cpus_per_worker=1.5), gpu_and_two_cpu_nodes())
    text = str(cpus.value)
    assert "node 1's CPUs" in text and "need 4.5 CPUs, the node has 4" in text
    assert "tools.pool_size" in text and "tools.cpus_per_worker=1.5" in text
    # node 1 gets 2 of 3 workers: 2 x 5 GiB = 10 GiB > 8
    run = agent(pool_size=3, memory_gib_per_worker=5)
    with pytest.raises(ResourceError, match=r"host memory: 2 tool worker\(s\).*10\.00 GiB.*8\.00"):
        build_plan(run, gpu_and_two_cpu_nodes())
    plan = build_plan(run, gpu_and_two_cpu_nodes(), check_fit=False)
    exported = plan_to_dict(plan)
    assert not exported["fits"] and "cluster.host_memory_gib" in exported["problems"][0]


def placed(pool_size: int, where: object):
    run = agent(pool_size=pool_size)
    run.placement.component_placement = {**run.placement.component_placement, "tools": where}
    return run


def test_a_placed_pool_must_match_pool_size_and_stay_off_the_devices():
    on_node_1 = {"node_group": "node", "placement": "1:0-3"}
    plan = build_plan(placed(4, on_node_1), gpu_and_two_cpu_nodes())
    assert [p.node_rank for p in plan.by_component["tools"]] == [1] * 4
    with pytest.raises(PlacementError, match=r"places 4 tool worker.*tools.pool_size=2"):
        build_plan(placed(2, on_node_1), gpu_and_two_cpu_nodes())
    with pytest.raises(PlacementError, match="gives tools devices.*node_group: node"):
        build_plan(placed(2, "0-1"), gpu_and_two_cpu_nodes())


def test_the_pool_leaves_fusion_alone():
    run = agent()
    run.placement.fuse = "auto"
    plan = build_plan(run, gpu_and_two_cpu_nodes())
    assert not any("tools" in b for b in fusion_blockers(run, plan))


def test_a_single_turn_run_has_no_pool_and_refuses_tools_keys():
    run = compose("collocated", **{"cluster.cpus_per_node": 4})
    plan = build_plan(run, gpu_and_two_cpu_nodes())
    assert "tools" not in plan.components and plan.tools is None
    assert "tools" not in component_builders(run, "reasoning")
    assert env_problems(run) == []
    run.tools.pool_size = 3
    run.placement.component_placement = {**run.placement.component_placement, "tools": "0"}
    problems = env_problems(run)
    assert problems[0].startswith("tools.pool_size=3 is set but the run has no task.env")
    assert "placement.component_placement places tools" in problems[1]


def test_out_of_range_pool_keys_are_refused():
    problems = env_problems(agent(pool_size=0, cpus_per_worker=0))
    assert "tools.pool_size=0 must be >= 1 (tool worker actors)" in problems
    assert "tools.cpus_per_worker=0.0 must be > 0" in problems
