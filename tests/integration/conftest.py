"""Fixtures every integration test directory shares: one local Ray per test session.

- ``ray_session``: the session's Ray (started on first use): 127.0.0.1, its own temp dir, no
  dashboard, ``SIM_DEVICES`` simulated devices of ``SIM_MEMORY_GIB`` each, the machine's cores.
  A module that needs a Ray of its own (the 2-node test) calls ``ray_session.suspend()`` first;
  the next test that asks for ``cluster`` starts the session Ray again.
- ``ray_address``: that Ray's address, for a subprocess run to join (``cluster.address=...``).
- ``cluster``: a fresh :class:`rltrain.scheduler.Cluster` job handle on that Ray; every actor,
  placement group and channel the test creates through it is removed afterwards (Ray stays up).

Budget (tests/README.md): a test that needs workers takes ``cluster``; a Ray start-up of its
own is for a test whose subject is Ray's start or loss, in a ``test_zz_*`` module.

Worker classes defined in test modules are shipped to Ray workers by value (test directories are
not importable packages there), so a test module can define its ``Worker`` subclasses inline.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

SIM_DEVICES = 2
SIM_MEMORY_GIB = 4.0
#: The ``cluster`` config of the session Ray (a dict in the ClusterConfig shape).
SESSION_CLUSTER: dict[str, Any] = {
    "address": None,
    "num_nodes": 1,
    "devices_per_node": SIM_DEVICES,
    "device_memory_gib": SIM_MEMORY_GIB,
    "simulate_devices": True,
    "cpus_per_node": os.cpu_count() or 2,
    "startup_timeout_s": 60.0,
    "collective_timeout_s": 60.0,
}


class RaySession:
    """Starts the session's Ray lazily; can stop it for a module that needs its own Ray."""

    def __init__(self) -> None:
        self._cluster: Any = None

    def ensure(self) -> Any:
        """The session's cluster, started if it is not running."""
        import ray

        from rltrain.scheduler import Cluster

        if self._cluster is None or not ray.is_initialized():
            self._cluster = Cluster.start(SESSION_CLUSTER)
        return self._cluster

    def suspend(self) -> None:
        """Stop the session's Ray (the next ``ensure`` restarts it)."""
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None


@pytest.fixture(scope="session")
def ray_session() -> Iterator[RaySession]:
    session = RaySession()
    yield session
    session.suspend()


@pytest.fixture
def ray_address(ray_session: RaySession) -> str:
    """The session Ray's address: a subprocess run joins it with ``cluster.address=...``
    instead of starting a Ray of its own (seconds of both cores)."""
    import ray

    ray_session.ensure()
    return ray.get_runtime_context().gcs_address


@pytest.fixture
def cluster(ray_session: RaySession) -> Iterator[Any]:
    """A job on the session Ray; everything it created is removed after the test."""
    from rltrain.scheduler import Cluster

    ray_session.ensure()
    job = Cluster.start(SESSION_CLUSTER)  # Ray is running: reused, not restarted
    yield job
    job.shutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Ray workers cannot import test modules (no package, not on their path): ship by value.
    modules = {item.module for item in items if getattr(item, "module", None) is not None}
    if not modules:
        return
    from ray import cloudpickle

    for module in modules:
        if "integration" in str(getattr(module, "__file__", "")):
            cloudpickle.register_pickle_by_value(module)
