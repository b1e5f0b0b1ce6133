"""A vLLM rollout builds its engine before the groups that share its GPUs start, and leaves
them its room first when its offload policy lets it (rltrain.runners.job)."""

from __future__ import annotations

from typing import Any

import pytest
from composed import composed_run as compose_run

from rltrain.config import engine_checks
from rltrain.placement.plan import build_plan
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec
from rltrain.runners import job
from rltrain.workers.common import ResidentState
from rltrain.workers.rollout import RolloutWorker

GPUS = ClusterSpec((NodeSpec(0, 2, 80 * GIB, "cuda"),))


@pytest.fixture
def gpu_machine(monkeypatch):
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: True)
    monkeypatch.setattr(engine_checks, "package_installed", lambda name: True)


def waves(*overrides: str) -> list[list[str]]:
    run = compose_run(*overrides, "cluster.simulate_devices=false")
    plan = build_plan(run, GPUS)
    return job.launch_waves(run, plan, [c for c in plan.components if c != "tools"])


def test_collocated_vllm_starts_before_the_groups_on_its_gpus(gpu_machine):
    first, later = waves("rollout.backend=vllm", "+placement.component_placement.reference=all")
    assert first[0] == "rollout" and "reward" in first  # the rule reward holds no GPU
    assert sorted(later) == ["actor", "reference"]


def test_other_runs_start_every_group_at_once(gpu_machine):
    (only,) = waves("rollout.backend=vllm", "placement=disaggregated")
    assert "rollout" in only and "actor" in only  # no GPU shared
    (only,) = waves("+placement.component_placement.reference=all")  # torch rollout
    assert {"rollout", "actor", "reference"} <= set(only)


class FakeGroup:
    """The two calls start_job makes on a group, recorded; every rank answers alike."""

    worker_class = RolloutWorker

    def __init__(self, sizes: dict[str, int], ranks: int = 2) -> None:
        self.sizes, self.ranks, self.calls = sizes, ranks, []

    def call(self, fn: Any, *args: Any) -> Any:
        self.calls.append((fn.__name__, *args))
        answer = [dict(self.sizes)] * self.ranks if fn is ResidentState.state_bytes else []
        return type("Done", (), {"wait": lambda _self: answer})()


def test_the_rollout_sleeps_with_its_sizes_read_first(gpu_machine):
    run = compose_run("rollout.backend=vllm", "cluster.simulate_devices=false")
    group = FakeGroup({"weights": 3 * GIB, "kv_cache": 20 * GIB})
    asleep = job._sleep_before_sharers(run, {"rollout": group})
    # sizes before the offload: an engine asleep reports a KV cache of 0 bytes
    assert group.calls == [("state_bytes",), ("offload", ["kv_cache", "weights"])]
    assert asleep == {"rollout": [{"weights": 3 * GIB, "kv_cache": 20 * GIB}] * 2}
    plan = build_plan(run, GPUS)
    coordinator, resident = job._residency(run, plan, {"rollout": group}, asleep)
    assert resident == ("rollout",)
    for rank in (0, 1):
        r = coordinator.residents[("rollout", rank)]
        assert r.total == {"weights": 3 * GIB, "kv_cache": 20 * GIB}
        assert r.offloaded == {"weights", "kv_cache"} and r.resident_bytes() == 0
    assert len(group.calls) == 2  # the coordinator asked nothing more


def test_a_rollout_that_stays_resident_is_not_put_to_sleep(gpu_machine):
    run = compose_run(
        "rollout.backend=vllm", "cluster.simulate_devices=false", "placement.offload.rollout=null"
    )
    group = FakeGroup({"weights": GIB, "kv_cache": GIB})
    assert job._sleep_before_sharers(run, {"rollout": group}) == {}
    assert group.calls == []
