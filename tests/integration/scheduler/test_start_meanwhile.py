"""``Cluster.start(meanwhile=...)``: the driver's own work runs beside Ray's start, and its
failure is the start's failure."""

from __future__ import annotations

import threading

import pytest
from session_ray import SESSION_CLUSTER

from rltrain.scheduler import Cluster

pytestmark = pytest.mark.timeout(120)


def test_the_work_runs_in_another_thread_and_is_done_when_start_returns(ray_session):
    ray_session.ensure()
    done: list[str] = []

    def work() -> None:
        done.append(threading.current_thread().name)

    with Cluster.start(SESSION_CLUSTER, meanwhile=work) as cluster:
        assert cluster.spec.num_nodes == 1
        assert len(done) == 1 and done[0] != threading.current_thread().name


def test_what_the_work_raised_is_raised_and_a_joined_ray_stays(ray_session):
    import ray

    ray_session.ensure()

    def work() -> None:
        raise ImportError("no module named 'missing_runner'")

    with pytest.raises(ImportError, match="missing_runner"):
        Cluster.start(SESSION_CLUSTER, meanwhile=work)
    assert ray.is_initialized()  # the session's Ray was joined, not started: it is not stopped
    with Cluster.start(SESSION_CLUSTER) as cluster:
        assert cluster.spec.num_nodes == 1
