"""A process placed on a node sees its node's accelerators (RLinf's meaning) and reserves none.

The real env worker (rltrain/workers/env.py), placed by ``node_group: node`` on the session's
simulated GPU node: the plan, the Ray reservation, the residency coordinator and the worker's
``CUDA_VISIBLE_DEVICES`` must all say the same thing.
"""

from __future__ import annotations

import os

import pytest

from rltrain.config.schema import RunConfig
from rltrain.placement.plan import build_plan
from rltrain.runners.job import _residency
from rltrain.workers.env import EnvWorker, probe_spaces

pytestmark = pytest.mark.timeout(180)


class SeeingEnvWorker(EnvWorker):
    """The env worker, plus a report of what the runtime showed it."""

    def seen(self) -> dict:
        return {
            "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devices": list(self.devices),
            "visible": list(self.placement.visible_accelerators),
            "stages": len(self.stages),
            "state": self.state_bytes(),
        }


def embodied_run() -> RunConfig:
    run = RunConfig()
    run.runner = "embodied"
    run.task.name, run.task.env_id = "gym", "CartPole-v1"
    run.env.num_envs, run.env.pipeline_stage_num = 4, 2
    run.placement.component_placement = {
        "actor": "0",
        "rollout": "1",
        "env": {"node_group": "node", "placement": "0"},
    }
    return run


def test_env_worker_placed_on_a_node_sees_the_nodes_devices(cluster):
    run = embodied_run()
    plan = build_plan(run, cluster.spec)
    (env,) = plan.placements("env")
    devices = cluster.spec.nodes[0].num_devices  # the session's simulated GPUs
    # The plan: every device of node 0 visible, none reserved, none shared with the env.
    assert env.device_ids == () and env.visible_accelerators == tuple(map(str, range(devices)))
    assert all("env" not in comps for comps in plan.sharing.values())
    reservation = cluster.reserve(plan, name="node-visible")
    group = SeeingEnvWorker.create_group(run, probe_spaces("CartPole-v1"), 2, 1).launch(
        cluster,
        name="env",
        placement_strategy=plan.placements("env"),
        reservation=reservation,
    )
    (seen,) = group.call(SeeingEnvWorker.seen).wait(timeout=60)
    # The worker: sees the node's devices, holds none of them, and its simulator is up.
    assert seen["cuda_visible"] == ",".join(map(str, range(devices)))
    assert seen["devices"] == [] and seen["visible"] == [str(d) for d in range(devices)]
    assert seen["stages"] == 2 and seen["state"] == {}
    # The reservation: the env's process starts in the node's CPU bundle, not a device's.
    slot = reservation.layout.slot("env", 0)
    assert reservation.layout.bundles[slot.bundle_index].device is None
    # The residency coordinator: no lease for a process that reserves no device.
    coordinator, resident = _residency(run, plan, {"env": group})
    assert resident == () and not coordinator.residents
