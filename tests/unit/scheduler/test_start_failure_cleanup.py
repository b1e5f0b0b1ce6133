"""A cluster whose start fails after Ray is up (a device probe during discovery, Ctrl-C)
disconnects from Ray and leaves no temp dir: no ``Cluster`` exists yet to shut it down, and a
later start in the same process must not find a Ray it did not start still connected."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import ray

from rltrain.errors import ResourceError
from rltrain.scheduler import cluster as cluster_module
from rltrain.scheduler.cluster import Cluster


@pytest.fixture
def failing_discovery(monkeypatch, tmp_path):
    """Ray's start and stop recorded (nothing starts), discovery failing; the start's temp
    dirs made under ``tmp_path``, the process's network settings left alone."""
    calls: list[str] = []
    made: list[str] = []

    def mkdtemp(prefix: str = "", dir: str | None = None) -> str:
        path = tmp_path / f"{prefix}{len(made)}"
        path.mkdir()
        made.append(str(path))
        return str(path)

    monkeypatch.setattr(cluster_module.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(cluster_module, "_use_loopback", lambda: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: calls.append("init"))
    monkeypatch.setattr(ray, "shutdown", lambda *a, **k: calls.append("shutdown"))
    monkeypatch.setattr(cluster_module, "local_gpu_count", lambda: 0)

    def fail(config):
        raise ResourceError("a device probe failed (cluster.startup_timeout_s)")

    monkeypatch.setattr(Cluster, "_discover", staticmethod(fail))
    return SimpleNamespace(calls=calls, made=made)


def test_a_local_start_failing_in_discovery_shuts_ray_down_and_removes_its_temp_dir(
    failing_discovery,
):
    with pytest.raises(ResourceError, match="a device probe failed"):
        Cluster.start({"address": None, "num_nodes": 1})
    assert failing_discovery.calls == ["init", "shutdown"]
    made = failing_discovery.made
    assert len(made) == 1 and not os.path.exists(made[0])


def test_a_joined_cluster_failing_in_discovery_is_disconnected(failing_discovery):
    with pytest.raises(ResourceError, match="a device probe failed"):
        Cluster.start({"address": "10.0.0.1:6379", "num_nodes": 1})
    assert failing_discovery.calls == ["init", "shutdown"] and failing_discovery.made == []
