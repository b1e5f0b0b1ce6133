"""Two simulated nodes (``ray.cluster_utils.Cluster`` behind ``Cluster.start(num_nodes=2)``).

One module, one 2-node cluster (~6 s, ~1 GB): it stops the session Ray first (a process holds one
Ray at a time); the next test that needs the session Ray starts it again. Named ``zz`` so it runs
after this directory's other modules.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from rltrain.placement.strategies import NodePlacementStrategy, PackedPlacementStrategy
from rltrain.scheduler import Cluster, Worker

pytestmark = pytest.mark.timeout(240)

TWO_NODES = {
    "num_nodes": 2,
    "devices_per_node": 2,
    "device_memory_gib": 2.0,
    "cpus_per_node": 1,
    "node_groups": [{"label": "trainers", "node_ranks": "1"}],
    "startup_timeout_s": 60.0,
}


class Where(Worker):
    def where(self) -> tuple[str, str, int]:
        import os

        return (
            ray.get_runtime_context().get_node_id(),
            os.environ["CUDA_VISIBLE_DEVICES"],
            int(os.environ["NODE_RANK"]),
        )


@pytest.fixture(scope="module")
def two_nodes(ray_session) -> Iterator[Cluster]:
    ray_session.suspend()
    cluster = Cluster.start(TWO_NODES)
    yield cluster
    cluster.shutdown()


def test_discovery_ranks_and_devices(two_nodes):
    spec = two_nodes.spec
    assert spec.num_nodes == 2 and [n.num_devices for n in spec.nodes] == [2, 2]
    assert [n.accelerator_type for n in spec.nodes] == ["sim", "sim"]
    assert [n.device_memory_bytes for n in spec.nodes] == [2 * 1024**3] * 2
    head = next(n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"])
    assert spec.nodes[0].ray_node_id == head  # head first
    assert spec.group("trainers").node_ranks == (1,)


def test_each_node_agent_binds_its_port_at_once(two_nodes):
    # Ray gives every node's dashboard agent port 52365: the second node's agent retried
    # binding for ~3.3 s, and its raylet waited for it, before the node could join.
    import glob
    import os

    session = ray._private.worker._global_node.get_session_dir_path()
    logs = glob.glob(os.path.join(session, "logs", "dashboard_agent*.log"))
    assert len(logs) == 2  # one agent per node
    for log in logs:
        with open(log) as f:
            assert "Failed to bind" not in f.read(), log


class Talker(Worker):
    def say(self, text: str) -> int:
        import os

        print(text, flush=True)
        return os.getpid()


def test_no_autoscaler_monitor_and_worker_output_still_reaches_the_driver(two_nodes, capfd):
    # A local Ray starts no autoscaler monitor (it writes monitor.log/.out/.err when it runs);
    # the log monitor, which carries worker output to the driver, still runs.
    import glob
    import os
    import time
    import uuid

    logs = os.path.join(ray._private.worker._global_node.get_session_dir_path(), "logs")
    assert not glob.glob(os.path.join(logs, "monitor*")), sorted(os.listdir(logs))
    assert glob.glob(os.path.join(logs, "log_monitor*.log"))
    text = f"talker-{uuid.uuid4().hex}"
    talker = Talker.create_group().launch(
        two_nodes, name="talker", placement_strategy=PackedPlacementStrategy(0, 0)
    )
    (pid,) = talker.call(Talker.say, text).wait(timeout=60)
    seen, deadline = "", time.monotonic() + 30  # Ray forwards worker output asynchronously
    while text not in seen and time.monotonic() < deadline:
        out, err = capfd.readouterr()
        seen += out + err
        time.sleep(0.1)
    assert f"pid={pid}" in seen and text in seen, seen[-2000:]
    talker.shutdown()


def test_actors_land_on_planned_nodes(two_nodes):
    spec = two_nodes.spec
    # Global device ranks 1 and 2: node 0 device 1, node 1 device 0.
    group = Where.create_group().launch(
        two_nodes, name="spread", placement_strategy=PackedPlacementStrategy(1, 2)
    )
    got = group.call(Where.where).wait(timeout=60)
    assert [(node, rank) for node, _, rank in got] == [
        (spec.nodes[0].ray_node_id, 0),
        (spec.nodes[1].ray_node_id, 1),
    ]
    trainers = Where.create_group().launch(
        two_nodes,
        name="trainers",
        placement_strategy=NodePlacementStrategy([0], node_group_label="trainers"),
    )
    ((node, visible, rank),) = trainers.call(Where.where).wait(timeout=60)
    # A node placement sees its node's devices without reserving them (as in RLinf).
    assert (node, visible, rank) == (spec.nodes[1].ray_node_id, "0,1", 1)


def test_a_sweep_job_reserves_on_the_node_its_slice_names(two_nodes, monkeypatch):
    """Job A holds node 0; job B, planned on node 0 too, was admitted by the sweep launcher on
    node 1 (``RLTRAIN_DEVICE_SLICE``): it reserves and runs there instead of waiting for node 0.
    """
    two_nodes.release()  # node 1 has a single CPU
    spec = two_nodes.spec
    Where.create_group().launch(
        two_nodes, name="a", placement_strategy=PackedPlacementStrategy(0, 1)
    )
    monkeypatch.setenv(
        "RLTRAIN_DEVICE_SLICE",
        '[{"job":[0,0],"cluster":[1,0]},{"job":[0,1],"cluster":[1,1]}]',
    )
    job_b = Cluster.start(TWO_NODES)  # Ray is running: joined, the slice read
    try:
        assert [n.ray_node_id for n in job_b.spec.nodes] == [
            spec.nodes[1].ray_node_id,
            spec.nodes[0].ray_node_id,
        ]
        group = Where.create_group().launch(
            job_b, name="b", placement_strategy=PackedPlacementStrategy(0, 1), timeout_s=20.0
        )
        got = group.call(Where.where).wait(timeout=60)
        assert [(node, rank) for node, _, rank in got] == [(spec.nodes[1].ray_node_id, 0)] * 2
    finally:
        job_b.shutdown()  # Ray stays: it is the module's
        two_nodes.release()


JOIN_SCRIPT = r"""
import json, os, sys
from rltrain.scheduler import Cluster, Worker
from rltrain.placement.strategies import PackedPlacementStrategy

class Probe(Worker):
    def mark(self):
        return os.environ.get("RLTRAIN_TEST_MARK"), os.environ["NODE_RANK"]

cfg = {"address": sys.argv[1], "num_nodes": 2, "startup_timeout_s": 30,
       "runtime_env": {"env_vars": {"RLTRAIN_TEST_MARK": "joined"}}}
with Cluster.start(cfg) as cluster:
    group = Probe.create_group().launch(cluster, name="probe",
                                        placement_strategy=PackedPlacementStrategy(3, 3))
    print(json.dumps({"nodes": [[n.rank, n.ray_node_id, n.num_devices] for n in cluster.spec.nodes],
                      "mark": group.call(Probe.mark).wait(timeout=60)}))
"""


def test_second_driver_joins_by_address(two_nodes):
    """``cluster.address=host:port``: discover the same ranks; runtime_env reaches workers."""
    import json
    import os
    import subprocess
    import sys

    two_nodes.release()  # free the earlier tests' groups: node 1 has a single CPU
    address = ray.get_runtime_context().gcs_address
    out = subprocess.run(
        [sys.executable, "-c", JOIN_SCRIPT, address],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["nodes"] == [[n.rank, n.ray_node_id, 2] for n in two_nodes.spec.nodes]
    assert got["mark"] == [["joined", "1"]]  # global device 3 = node 1 device 1
    # The joining job left nothing behind, and this driver's Ray still runs.
    assert ray.is_initialized()
