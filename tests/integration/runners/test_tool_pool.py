"""The tool pool (component ``tools``) as real Ray actors: placed where the plan says, hosting
environments and serving tool calls; a dead tool worker fails its episodes' calls and stops
the run with a message naming it."""

from __future__ import annotations

import pytest

from rltrain.config.schema import RunConfig
from rltrain.errors import WorkerError
from rltrain.placement.plan import build_plan
from rltrain.tasks.base import Example
from rltrain.workers.tools import RayToolPool, ToolWorker

pytestmark = pytest.mark.timeout(240)


def calc_run() -> RunConfig:
    run = RunConfig()
    run.task.env = "rltrain.tasks.calc_tool:CalculatorEnv"
    run.placement.component_placement = {"actor,rollout,reward": "all"}
    run.tools.pool_size, run.tools.concurrency = 2, 2
    run.tools.cpus_per_worker, run.tools.memory_gib_per_worker = 0.75, 0.25
    return run


def test_the_pool_runs_on_its_planned_node_serves_calls_and_fails_clearly_when_one_dies(cluster):
    import ray

    run = calc_run()
    plan = build_plan(run, cluster.spec)
    planned = plan.placements("tools")
    assert len(planned) == 2 and all(p.device_ids == () for p in planned)
    group = ToolWorker.create_group(run).launch(cluster, name="tools", placement_strategy=planned)
    states = group.call(ToolWorker.state).wait()
    assert [s.node for s in states] == [p.cluster_node_rank for p in planned]
    assert len({s.pid for s in states}) == 2  # two actor processes
    # each asks Ray for exactly tools.cpus_per_worker CPUs and tools.memory_gib_per_worker
    want = {"CPU": 0.75, "memory": 0.25 * 2**30}
    assert [{k: s.resources.get(k) for k in want} for s in states] == [want, want]

    pool = RayToolPool(group.actors)
    examples = [Example("3+4=", "7"), Example("5+6=", "11"), Example("1+1=", "2")]
    opened = pool.open(examples)
    assert [first for _, first in opened] == [ex.prompt for ex in examples]
    assert [rank for (rank, _), _ in opened] == [0, 1, 0]  # round robin over the workers
    assert [s.open_envs for s in group.call(ToolWorker.state).wait()] == [2, 1]

    call = pool.step(opened[1][0], "calculator[5+6]", None).result(timeout=60)
    assert call.observation.startswith("=11") and not call.done and call.info["tool"]
    answer = pool.step(opened[1][0], "11", None).result(timeout=60)
    assert answer.done and answer.reward == 1.0
    pool.check()  # nothing died

    ray.kill(group.actors[1], no_restart=True)
    _wait_dead(group.actors[1])  # ray.kill returns before the actor is gone
    with pytest.raises(ray.exceptions.RayActorError):
        pool.step(opened[1][0], "calculator[1+1]", None).result(timeout=60)
    alive = pool.step(opened[0][0], "calculator[3+4]", None).result(timeout=60)
    assert alive.observation.startswith("=7")  # the other worker still serves
    with pytest.raises(WorkerError, match=r"tool worker\(s\) \[1\] of the tool pool died"):
        pool.check()
    pool.close([h for h, _ in opened])


def _wait_dead(actor, timeout_s: float = 60.0) -> None:
    """Return once ``actor`` answers its readiness call with RayActorError (it died)."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return
    raise AssertionError(f"the killed actor still answered after {timeout_s} s")
