"""Fixtures every integration test directory shares, on one local Ray per test process.

- ``ray_session`` and ``ray_address`` (``tests/conftest.py``; the Ray in
  ``tests/session_ray.py``): the session's Ray, started on first use: 127.0.0.1, its own temp
  dir, ``SIM_DEVICES`` simulated devices of ``SIM_MEMORY_GIB`` each, the machine's cores. A
  module that needs a Ray of its own (the 2-node test) calls ``ray_session.suspend()`` first; the
  next test that asks for ``cluster`` starts the session Ray again. ``ray_address`` is its
  address, for a subprocess run to join (``cluster.address=...``).
- ``cluster``: a fresh :class:`rltrain.scheduler.Cluster` job handle on that Ray; every actor,
  placement group and channel the test creates through it is removed afterwards (Ray stays up).

Budget (tests/README.md): a test that needs workers takes ``cluster``; a Ray start-up of its
own is for a test whose subject is Ray's start or loss, in a ``test_zz_*`` module.

Worker classes defined in test modules are shipped to Ray workers by value (test directories are
not importable packages there), so a test module can define its ``Worker`` subclasses inline.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from session_ray import SESSION_CLUSTER, RaySession


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
