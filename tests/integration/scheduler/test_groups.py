"""Worker groups on the session Ray: environment per placement, calls, views, shipped layouts."""

from __future__ import annotations

import os
import pathlib

import pytest
import ray
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config import load_config
from rltrain.config.store import register_configs
from rltrain.errors import PlacementError, WorkerError
from rltrain.placement.component import ComponentPlacement
from rltrain.placement.strategies import NodePlacementStrategy, PackedPlacementStrategy
from rltrain.placement.types import Placement
from rltrain.scheduler import Worker

pytestmark = pytest.mark.timeout(180)

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"
ENV_KEYS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "RLTRAIN_ACCELERATOR",
)


class EnvWorker(Worker):
    """Reports what the runtime gave it; imports no torch."""

    def __init__(self, tag: str = "none") -> None:
        self.tag = tag

    def report(self) -> dict:
        return {
            "env": {k: os.environ.get(k) for k in ENV_KEYS},
            "rank": self.rank,
            "world_size": self.world_size,
            "devices": list(self.devices),
            "labels": list(self.device_labels),
            "tag": self.tag,
            "node_id": ray.get_runtime_context().get_node_id(),
            "torch_loaded": "torch" in __import__("sys").modules,
        }

    def echo(self, x: int) -> tuple[int, int]:
        return self.rank, x


def expected_env(p, world: int, physical: list[int]) -> dict:
    return {
        "RANK": str(p.rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(p.local_rank),
        "LOCAL_WORLD_SIZE": str(p.local_world_size),
        "NODE_RANK": str(p.cluster_node_rank),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, physical)),
        "RLTRAIN_ACCELERATOR": p.accelerator_type,
    }


def test_worker_is_a_plain_class():
    w = EnvWorker(tag="t")
    assert (w.rank, w.world_size, w.devices, w.placement) == (0, 1, (), None)
    assert w.echo(3) == (0, 3)


def test_group_env_calls_and_views(cluster):
    group = EnvWorker.create_group(tag="a").launch(
        cluster, name="envs", placement_strategy=PackedPlacementStrategy(0, 1)
    )
    reports = group.call(EnvWorker.report).wait(timeout=60)
    placements = group.placements
    assert [r["rank"] for r in reports] == [0, 1]
    for p, r in zip(placements, reports, strict=True):
        phys = [cluster_phys for cluster_phys in group.reservation.visible_devices(p)]
        env = r["env"]
        assert {k: env[k] for k in expected_env(p, 2, phys)} == expected_env(p, 2, phys)
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert r["devices"] == [0] and r["labels"] == [f"node0/dev{p.device_ids[0]}"]
        assert r["tag"] == "a" and r["world_size"] == 2 and not r["torch_loaded"]
        # One job on a 2-core node, one process per device: 1 thread each.
        assert env["OMP_NUM_THREADS"] == "1"
    # The two processes got the two different devices Ray reserved for the job.
    assert sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in reports) == ["0", "1"]
    # A call on every rank, on some ranks, with arguments per rank; no call by name.
    assert group.call(EnvWorker.echo, 5).wait() == [(0, 5), (1, 5)]
    assert group.execute_on(1).call(EnvWorker.echo, 7).wait() == [(1, 7)]
    assert group.call_each(EnvWorker.echo, [(1,), (2,)]).wait() == [(0, 1), (1, 2)]
    with pytest.raises(AttributeError):
        group.echo  # noqa: B018 - methods are called through group.call(EnvWorker.echo)
    with pytest.raises(WorkerError, match="is not a method of EnvWorker"):
        group.call(len, [])
    with pytest.raises(WorkerError, match="ranks must be in 0..1"):
        group.execute_on(2)


def test_not_isolated_sees_all_job_devices(cluster):
    group = EnvWorker.create_group().launch(
        cluster,
        name="shared",
        placement_strategy=PackedPlacementStrategy(0, 1),
        isolate_accelerator=False,
    )
    reports = group.call(EnvWorker.report).wait(timeout=60)
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in reports] == ["0,1", "0,1"]
    # Each process uses its own device: its index in the visible list.
    assert [r["devices"] for r in reports] == [[0], [1]]


def test_node_only_group_sees_its_nodes_devices_without_holding_them(cluster):
    group = EnvWorker.create_group().launch(
        cluster, name="cpu", placement_strategy=NodePlacementStrategy([0, 0])
    )
    reports = group.call(EnvWorker.report).wait(timeout=60)
    # RLinf's meaning: a node process sees the node's accelerators (the session's 2 simulated
    # devices) and reserves none (no device index of its own).
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in reports] == ["0,1", "0,1"]
    assert [r["devices"] for r in reports] == [[], []]
    assert [r["env"]["LOCAL_RANK"] for r in reports] == ["0", "1"]


def test_bad_strategy_is_a_placement_error(cluster):
    with pytest.raises(PlacementError, match="neither a placement strategy"):
        EnvWorker.create_group().launch(cluster, name="bad", placement_strategy="0-1")
    # A hand-made placement on a device the node lacks is refused before anything starts.
    bad = Placement(0, 0, 0, 5, "sim", 0, 1, ("5",), True, (5,))
    with pytest.raises(PlacementError, match="uses devices \\[5\\] on node 0"):
        EnvWorker.create_group().launch(cluster, name="bad", placement_strategy=[bad])


def compose_run(placement: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=[f"placement={placement}"]))


@pytest.mark.parametrize("layout", sorted(p.stem for p in (CONF / "placement").glob("*.yaml")))
def test_shipped_placement_launches(cluster, layout):
    """Reserve for the whole layout, launch every component into it, check each environment."""
    run = compose_run(layout)
    placement = ComponentPlacement(run, cluster.spec)
    plan = {c: placement.get_placements(c) for c in placement.components}
    reservation = cluster.reserve(plan, timeout_s=60)
    groups = {
        c: EnvWorker.create_group(tag=c).launch(
            cluster, name=c, placement_strategy=ps, reservation=reservation
        )
        for c, ps in plan.items()
    }
    for c, group in groups.items():
        for p, r in zip(plan[c], group.call(EnvWorker.report).wait(timeout=60), strict=True):
            phys = list(reservation.visible_devices(p))
            assert {k: r["env"][k] for k in expected_env(p, len(plan[c]), phys)} == expected_env(
                p, len(plan[c]), phys
            ), (layout, c, p.rank)
            assert r["node_id"] == cluster.spec.nodes[p.cluster_node_rank].ray_node_id
    # Components the layout collocates see the same physical devices.
    seen = {c: {d for p in plan[c] for d in reservation.visible_devices(p)} for c in plan}
    if run.placement.mode == "collocated":
        assert seen["actor"] == seen["rollout"] == {0, 1}
    if run.placement.mode == "disaggregated":
        assert not seen["actor"] & seen["rollout"]
