"""A job probes the GPUs of the nodes it uses only (a broken node of another tenant is not its
business), within ``cluster.startup_timeout_s``, and names a broken node and the keys."""

from __future__ import annotations

import pytest

from rltrain.errors import ConfigError
from rltrain.placement.types import GIB
from rltrain.scheduler import cluster


def _entry(node: str, ip: str, head: bool = False) -> dict:
    res = {"CPU": 8.0, "GPU": 2.0, "accelerator_type:H100": 1.0}
    if head:
        res["node:__internal_head__"] = 1.0
    return {"NodeID": node, "Alive": True, "NodeManagerAddress": ip, "Resources": res}


def test_only_the_job_nodes_are_probed_with_the_configured_timeout(monkeypatch):
    asked = []

    def measure(entries, timeout_s):
        asked.append(([e["NodeID"] for e in entries], timeout_s))
        return {e["NodeID"]: 80 * GIB for e in entries}

    monkeypatch.setattr(cluster, "_measure_gpu_memory", measure)
    # node-c (another tenant's, ranked third) has no working CUDA: the job never asks it
    entries = [
        _entry("node-c", "10.0.0.3"),
        _entry("node-a", "10.0.0.1", True),
        _entry("node-b", "10.0.0.2"),
    ]
    spec = cluster.Cluster._spec_from(entries, {"num_nodes": 2, "startup_timeout_s": 30})
    assert asked == [(["node-a", "node-b"], 30.0)]
    assert [n.ray_node_id for n in spec.nodes] == ["node-a", "node-b"]


def test_a_broken_node_is_named_with_the_key(monkeypatch):
    monkeypatch.setattr(cluster, "_GPU_MEMORY", {})
    monkeypatch.setattr(cluster, "_GPU_IDS", {})
    gpu = {"node-b": _entry("node-b", "10.0.0.2"), "node-a": _entry("node-a", "10.0.0.1")}
    problems = cluster._record(
        gpu, ["node-a", "node-b"], [(80 * GIB, ["2", "3"]), "torch cannot use CUDA there"]
    )
    assert problems == [
        "node node-b (10.0.0.2) reports GPUs to Ray, but torch cannot use CUDA there"
    ]
    assert cluster._GPU_MEMORY == {"node-a": 80 * GIB}
    assert cluster.gpu_ids("node-a") == (2, 3) and cluster.gpu_ids("node-b") is None


def test_local_nodes_never_share_the_machine_gpus(monkeypatch):
    monkeypatch.setattr(cluster, "local_gpu_count", lambda: 2)
    cfg = {"num_nodes": 2, "devices_per_node": 1, "cpus_per_node": 2}
    with pytest.raises(ConfigError, match=r"cluster.num_nodes=2 .* 2 real GPU.*num_nodes=1"):
        cluster.Cluster._local_node_args(cfg, 2)
    # one node: Ray detects the machine's GPUs itself
    assert cluster.Cluster._local_node_args({**cfg, "num_nodes": 1}, 1) == [{"num_cpus": 2}]
