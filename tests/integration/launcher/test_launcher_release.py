"""After a job ends the launcher waits for Ray to free that job's devices, and only those: what
was free when the sweep started on the job's nodes, less what the running jobs hold. GPUs other
Ray jobs hold (a shared cluster) are never waited for. Also: the runtime_env each job's driver
connects with (the launcher's and the jobs' ``cluster.runtime_env``, merged)."""

from __future__ import annotations

import time

import pytest

from hydra_plugins.rltrain_launcher import _ray
from rltrain.errors import ConfigError


def test_expected_free_counts_the_ended_jobs_nodes_less_the_running_jobs():
    # At the start another tenant held 1 of node 1's 4 GPUs: 4 and 3 were free.
    free_at_start = {0: 4.0, 1: 3.0}
    ended = {(1, 0), (1, 1)}  # the ended job's slice: two devices of node 1
    running = {(0, 0), (1, 2)}  # the other running job: one device on each node
    assert _ray.expected_free(free_at_start, ended, running) == {1: 2.0}
    assert _ray.expected_free(free_at_start, {(0, 1)}, ()) == {0: 4.0}


def test_runtime_envs_merge_variable_by_variable_and_clashes_are_refused():
    remote = {"env_vars": {"A": "1"}, "working_dir": "."}
    cluster = {"runtime_env": {"env_vars": {"HF_HOME": "/data/hf"}, "pip": ["x"]}}
    assert _ray.job_runtime_env(remote, cluster) == {
        "env_vars": {"A": "1", "HF_HOME": "/data/hf"},
        "working_dir": ".",
        "pip": ["x"],
    }
    assert _ray.job_runtime_env({}, {"runtime_env": {}}) == {}
    assert _ray.job_runtime_env(None, None) == {}
    clash = {"runtime_env": {"env_vars": {"A": "2"}}}
    with pytest.raises(ConfigError, match=r"both set env_vars.A: '1' vs '2'"):
        _ray.job_runtime_env(remote, clash)


def test_gpus_another_ray_job_holds_are_not_waited_for(ray_session):
    import ray
    from session_ray import SESSION_CLUSTER

    ray_session.ensure()

    @ray.remote(num_gpus=1, num_cpus=0)
    class Tenant:
        def ready(self) -> bool:
            return True

    tenant = Tenant.remote()  # another Ray job's GPU, held when the sweep connects
    ray.get(tenant.ready.remote(), timeout=60)
    try:
        session = _ray.connect({"address": None}, SESSION_CLUSTER)  # joins this Ray
        node = ray.get_runtime_context().get_node_id()
        assert session.node_ids == {0: node}
        total = ray.cluster_resources()["GPU"]
        assert session.free_gpus == {0: total - 1}
        # job #0 ended on device 0 of node 0, no other job runs: wait for what was free
        expected = _ray.expected_free(session.free_gpus, {(0, 0)}, ())
        begun = time.monotonic()
        assert _ray.wait_devices_free({node: expected[0]}, 10.0)
        assert time.monotonic() - begun < 5.0
        # the old check waited for every GPU of the cluster, the tenant's too
        assert not _ray.wait_devices_free({node: total}, 0.5)
    finally:
        ray.kill(tenant)
