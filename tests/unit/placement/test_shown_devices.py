"""``placement.isolate_accelerator=false``: the plan shows a process the devices the run's
reservation exposes to it, every device the job uses on its node (no Ray)."""

from __future__ import annotations

from placement_helpers import compose

from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec


def plan_of(**overrides):
    run = compose("disaggregated", **overrides)
    return build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)


def test_a_process_that_is_not_isolated_sees_the_jobs_devices_on_its_node_only():
    plan = plan_of(**{"cluster.devices_per_node": 4, "placement.isolate_accelerator": False})
    used = sorted({d for p in plan.processes for d in p.devices})
    assert used == [0, 1]  # the job leaves devices 2 and 3 of the node to others
    for p in plan.processes:
        if p.devices:
            assert p.placement.visible_accelerators == ("0", "1"), p


def test_an_isolated_process_sees_its_own_devices():
    plan = plan_of(**{"cluster.devices_per_node": 4})
    for p in plan.processes:
        if p.devices:
            assert p.placement.visible_accelerators == tuple(map(str, p.devices)), p
