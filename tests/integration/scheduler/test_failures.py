"""Failures: remote exceptions, kill -9, unsatisfiable reservations, cleanup, disjoint jobs."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
import ray
from ray.util import placement_group_table

from rltrain import app
from rltrain.errors import ResourceError, WorkerError
from rltrain.placement.strategies import PackedPlacementStrategy
from rltrain.scheduler import Cluster, Worker

pytestmark = pytest.mark.timeout(180)
JOB = {"startup_timeout_s": 30.0}  # a job on the session Ray (reused: only timeouts matter)


class Flaky(Worker):
    def __init__(self) -> None:
        self._release = threading.Event()

    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad batch on rank {rank}")
        return self.rank

    def hold(self, limit_s: float) -> int:
        # Stands in for a collective a dead peer never joins: blocks until released.
        self._release.wait(limit_s)
        return self.rank

    def pid(self) -> int:
        return os.getpid()

    def take(self, value: float) -> float:
        return value

    def devices_env(self) -> str:
        return os.environ["CUDA_VISIBLE_DEVICES"]


class BadInit(Worker):
    def __init__(self) -> None:
        raise TypeError("bad argument in worker __init__")


class Scorer(Worker):
    def score(self) -> float:
        raise RuntimeError("reward outage")

    def crash(self) -> float:
        os._exit(1)


def actor_states(group, settle_s: float = 30.0) -> list[str]:
    """The group's actors' states in the GCS actor table (no dashboard needed), read until
    none is still alive or ``settle_s`` passes: ``ray.kill`` returns before the GCS records
    the death, so a first read right after a teardown can still say ALIVE."""
    deadline = time.monotonic() + settle_s
    while True:
        table = ray._private.state.actors()
        states = [table[a._actor_id.hex()]["State"] for a in group.actors]
        if all(s == "DEAD" for s in states) or time.monotonic() > deadline:
            return states
        time.sleep(0.1)


def pg_state(reservation) -> str:
    return placement_group_table(reservation.pg)["state"]


def test_exception_names_group_rank_node_devices_and_traceback(cluster):
    group = Flaky.create_group().launch(
        cluster, name="learner", placement_strategy=PackedPlacementStrategy(0, 1)
    )
    with pytest.raises(WorkerError) as info:
        group.call(Flaky.fail_on, 1).wait(timeout=60)
    text = str(info.value)
    assert "group 'learner' rank 1" in text
    assert "node 0 127.0.0.1" in text and cluster.spec.nodes[0].ray_node_id[:12] in text
    assert "devices ['node0/dev1']" in text
    assert "ValueError: bad batch on rank 1" in text and "in fail_on" in text  # traceback
    # The siblings were torn down with it; the group refuses further calls.
    assert actor_states(group) == ["DEAD", "DEAD"]
    with pytest.raises(WorkerError, match="torn down after a failure"):
        group.call(Flaky.pid)


def test_an_exception_in_init_is_reported_with_its_cause_not_as_a_death(cluster):
    with pytest.raises(WorkerError) as info:
        BadInit.create_group().launch(
            cluster, name="badinit", placement_strategy=PackedPlacementStrategy(0, 0)
        )
    err = info.value
    first = str(err).splitlines()[0]
    assert "group 'badinit' rank 0" in first
    assert "its __init__ raised: TypeError: bad argument in worker __init__" in first
    assert "died" not in first and "If the node left the cluster" not in str(err)
    # The cause is what the restart policy reads: a TypeError is not worth a restart.
    assert isinstance(err.cause, TypeError) and isinstance(err.cause, app.DETERMINISTIC)
    assert err.where == "group 'badinit' rank 0 '__init__'"


def _fed_from(cluster, producer: str, learner: str, method) -> tuple[Any, WorkerError]:
    """A ``Scorer`` group named ``producer`` runs ``method``; a ``Flaky`` group named
    ``learner`` is handed its result: the group and the error the learner's wait raises."""
    scorer = Scorer.create_group().launch(
        cluster, name=producer, placement_strategy=PackedPlacementStrategy(0, 0)
    )
    taker = Flaky.create_group().launch(
        cluster, name=learner, placement_strategy=PackedPlacementStrategy(1, 1)
    )
    scores = scorer.call(method)
    with pytest.raises(WorkerError) as info:
        taker.call(Flaky.take, scores.refs[0]).wait(timeout=60)
    return scorer, info.value


def test_a_failed_input_is_blamed_on_the_worker_that_raised(cluster):
    scorer, err = _fed_from(cluster, "scorer", "learner2", Scorer.score)
    first = str(err).splitlines()[0]
    assert first.startswith("group 'learner2' rank 0")
    assert "its input from group 'scorer' rank 0" in first and "'score' failed" in first
    assert first.endswith("RuntimeError: reward outage:")
    assert err.where == "group 'scorer' rank 0 'score' (an input of group 'learner2' rank 0 'take')"
    assert err.worker == scorer.workers[0]
    assert app._cause(err) == f"RuntimeError: reward outage in {err.where}"
    scorer.shutdown()


def test_an_input_whose_worker_died_is_blamed_on_that_worker(cluster):
    scorer, err = _fed_from(cluster, "crasher", "learner3", Scorer.crash)
    first = str(err).splitlines()[0]
    assert first.startswith("group 'learner3' rank 0")
    assert "'take' could not run: the worker process of its input, group 'crasher' rank 0" in first
    assert first.endswith("died:")
    assert err.where == "group 'crasher' rank 0 (an input of group 'learner3' rank 0 'take')"
    assert err.worker == scorer.workers[0] and err.cause is None
    assert "crasher rank 0" in str(err).split("This job's processes on node")[1]
    scorer.shutdown()


def test_kill_9_fails_the_pending_call(cluster):
    group = Flaky.create_group().launch(
        cluster, name="victim", placement_strategy=PackedPlacementStrategy(0, 1)
    )
    pids = group.call(Flaky.pid).wait(timeout=60)
    pending = group.call(Flaky.hold, 120)
    os.kill(pids[1], signal.SIGKILL)
    # Detected well before the 120 s the ranks would hold (wait() would raise CallTimeoutError).
    with pytest.raises(WorkerError) as info:
        pending.wait(timeout=30)
    text = str(info.value)
    assert "group 'victim' rank 1" in text and "process died" in text and str(pids[1]) in text
    assert actor_states(group) == ["DEAD", "DEAD"]  # rank 0 was not left holding


def test_shutdown_removes_every_actor_and_placement_group(ray_session):
    ray_session.ensure()
    job = Cluster.start(JOB)
    first = PackedPlacementStrategy(0, 0)
    res = job.reserve({"a": first.get_placement(job.spec)})
    group = Flaky.create_group().launch(job, name="a", placement_strategy=first, reservation=res)
    own = Flaky.create_group().launch(
        job, name="b", placement_strategy=PackedPlacementStrategy(1, 1)
    )
    assert pg_state(res) == pg_state(own.reservation) == "CREATED"
    with job:  # leaving the block (here normally; also on an exception) releases everything
        pass
    assert actor_states(group) == ["DEAD"] and actor_states(own) == ["DEAD"]
    assert pg_state(res) == pg_state(own.reservation) == "REMOVED"
    assert ray.is_initialized()  # the session's Ray was reused, so it stays up


def test_two_jobs_get_disjoint_devices_and_a_third_times_out(ray_session):
    ray_session.ensure()
    with Cluster.start(JOB) as job_a, Cluster.start(JOB) as job_b:
        one = PackedPlacementStrategy(0, 0)  # both plans say "device 0"
        a = Flaky.create_group().launch(job_a, name="w", placement_strategy=one)
        b = Flaky.create_group().launch(job_b, name="w", placement_strategy=one)
        devices = a.call(Flaky.devices_env).wait(timeout=60) + b.call(Flaky.devices_env).wait(
            timeout=60
        )
        assert sorted(devices) == ["0", "1"]
        with Cluster.start(JOB) as job_c:
            with pytest.raises(ResourceError) as info:
                job_c.reserve({"w": one.get_placement(job_c.spec)}, timeout_s=2)
            assert "needs GPU 1" in str(info.value) and "free GPU 0" in str(info.value)
            # Nothing stays reserved after the failure.
            pending = [pg for pg in placement_group_table().values() if pg["state"] == "PENDING"]
            assert pending == []


class EnvReader(Worker):
    def read(self, name: str) -> str | None:
        return os.environ.get(name)


def test_a_job_joining_a_connected_ray_gives_its_workers_its_runtime_env(ray_session):
    # The driver connected Ray itself (as a user's ray.init, or the session's): the job's
    # cluster.runtime_env never went to Ray's job config, so each worker is started with it.
    from session_ray import SESSION_CLUSTER

    ray_session.ensure()
    env = {"env_vars": {"RLTRAIN_TEST_RUNTIME_ENV": "from-cluster-config"}}
    job = Cluster.start({**SESSION_CLUSTER, "runtime_env": env})
    try:
        group = EnvReader.create_group().launch(
            job, name="envreader", placement_strategy=PackedPlacementStrategy(0, 0)
        )
        assert group.call(EnvReader.read, "RLTRAIN_TEST_RUNTIME_ENV").wait(timeout=60) == [
            "from-cluster-config"
        ]
    finally:
        job.shutdown()
