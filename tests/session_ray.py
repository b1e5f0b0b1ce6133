"""The test session's one local Ray (per test process), shared by every test directory.

``tests/conftest.py`` makes it the ``ray_session`` and ``ray_address`` fixtures; the integration
tests' ``cluster`` fixture starts jobs on it; the bench test (``unit/bench``) runs its
default-shape measures on it.
"""

from __future__ import annotations

import os
from typing import Any

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
