"""Losing a node mid-run: the run fails within seconds naming the node and the job's processes
on it, and leaves no actor, placement group, process or shared-memory file behind.

The job runs on two simulated nodes (``cluster.num_nodes=2``: ``ray.cluster_utils``), the
rollout alone on the second; that node is removed (its raylet and workers killed, not shut down
gracefully) once the run has trained a few steps. Named ``zz`` so it runs after the modules
that share the session's one-node Ray (it stops that Ray first).
"""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest
import ray

from rltrain.config import load_config
from rltrain.errors import WorkerError
from rltrain.scheduler import Cluster

pytestmark = pytest.mark.timeout(600)

RUN = {
    "cluster": {"num_nodes": 2, "devices_per_node": 1, "cpus_per_node": 2},
    "placement": {
        "mode": None,
        "component_placement": {
            "actor": "0",  # node 0
            "rollout": "1",  # node 1: the one that goes
            "reward": {"node_group": "node", "placement": "0"},
        },
    },
    "trainer": {"total_steps": 400, "train_batch_size": 4, "eval_every": 0, "save_every": 2},
    "logging": {"progress": False, "trace": False},
}


def test_losing_a_node_fails_fast_naming_it_and_leaves_nothing(ray_session, tmp_path, monkeypatch):
    from rltrain.runners.reasoning import run_reasoning

    ray_session.suspend()
    shm_before = set(os.listdir("/dev/shm"))
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    started: list[Cluster] = []
    start = Cluster.start.__func__

    def recording_start(cls, config=None):
        cluster = start(cls, config)
        started.append(cluster)
        return cluster

    monkeypatch.setattr(Cluster, "start", classmethod(recording_start))
    removed_at: list[float] = []

    def remove_second_node() -> None:
        metrics = tmp_path / "metrics.jsonl"
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                local = started[0]._local_cluster
                node = next(iter(local.worker_nodes))
                removed_at.append(time.monotonic())
                local.remove_node(node, allow_graceful=False)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=remove_second_node, daemon=True)
    killer.start()
    with pytest.raises(WorkerError) as info:
        run_reasoning(load_config(RUN), str(tmp_path))
    killer.join(timeout=5)

    # the failure names the lost node and the rank on it (Ray's node death, not a collective
    # timing out: that error would name neither)
    message = str(info.value)
    assert removed_at and "node 1" in message and "rollout rank 0" in message
    assert not ray.is_initialized()  # the job's own Ray, actors and placement group are gone
    leftover = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in children_before and p.is_running() and p.status() != "zombie"
    ]
    gone, alive = psutil.wait_procs(leftover, timeout=30)
    assert not alive, f"left running: {[p.cmdline()[:1] for p in alive]}"
    # Other test processes may hold a file for a moment (a host all-reduce maps one and unlinks
    # it at once); one of this job's would stay.
    deadline = time.monotonic() + 30
    while set(os.listdir("/dev/shm")) - shm_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert set(os.listdir("/dev/shm")) <= shm_before
