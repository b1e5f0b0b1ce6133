"""``plan_scale``: resolving a full plan as the cluster grows (8 ... 1,024 nodes x 8 devices).

Eight components: actor, critic and reference collocated on every device, rollout engines of two
devices on every device, inference and env on every device, a reward process per node and two
agent processes per node (the RLinf example's node-only group) — about 47 processes per node.
The baseline is the smallest cluster; the per-size ratio and the scaling exponent show whether
time grows linearly with nodes.
"""

from __future__ import annotations

from rltrain.bench.harness import Case, Suite, measure

NODES = (8, 16, 32, 64, 128, 256, 512, 1024)
QUICK_NODES = (8, 16, 32)


def plan_run(num_nodes: int):
    """The run config the measure plans (also used by the placement tests)."""
    from rltrain.config.schema import RunConfig

    run = RunConfig()
    run.cluster.num_nodes = num_nodes
    run.cluster.devices_per_node = 8
    run.cluster.device_memory_gib = 80.0
    run.cluster.simulate_devices = False
    run.rollout.tensor_parallel_size = 2
    run.placement.component_placement = {
        "actor,critic,reference": "all",
        "rollout": "all",
        "inference": "all",
        "env": "all",
        "reward": {"node_group": "node", "placement": "all"},
        "agent": {"node_group": "node", "placement": f"all:0-{2 * num_nodes - 1}"},
    }
    return run


def _case(num_nodes: int) -> Case:
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec

    run = plan_run(num_nodes)
    cluster = ClusterSpec.from_config(run.cluster)

    def resolve() -> None:
        plan = build_plan(run, cluster)
        assert len(plan.processes) == 47 * num_nodes  # noqa: S101 - a benchmark sanity check

    return Case(
        f"nodes={num_nodes}", resolve, size=num_nodes, work=47 * num_nodes, work_unit="processes"
    )


@measure("plan_scale", "resolve a full plan: N nodes x 8 devices, 8 components (build_plan)")
def plan_scale(quick: bool) -> Suite:
    nodes = QUICK_NODES if quick else NODES
    return Suite(
        cases=tuple(_case(n) for n in nodes),
        baseline=f"nodes={nodes[0]}",
        warmup=1,
        repeats=5,
        note="Goal: per-size ratio near 1 and a scaling exponent near 1 (linear in nodes).",
    )
