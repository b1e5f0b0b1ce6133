"""Test-session setup shared by every test directory."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest
import suite_order
from session_ray import RaySession

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A closed machine: Ray on loopback with no auth token prompt, gloo on the loopback interface.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads that finish their share of an op sleep at once instead of spinning for the
# next one: the suite runs several torch processes (two test processes, their Ray workers, the
# runs they start) on 2 cores, and a spinning thread burns a core another process needs (a
# 200-step plain loop with 2 threads beside the suite's load: 79.6 CPU-s spinning, 8.4 passive).
# It changes no result (the same threads split the same work); the test processes set it before
# torch loads, and every process they start inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _loadgroup(config: pytest.Config) -> bool:
    """Whether this session's tests go out by ``xdist_group``: the controller's ``--dist``, or,
    in an xdist worker process (where ``dist`` reads "no"), the flag xdist sets from it."""
    return config.getoption("dist", None) == "loadgroup" or bool(
        getattr(config.option, "loadgroup", False)
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _loadgroup(config):
        suite_order.group_for_xdist(items)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return ROOT


@pytest.fixture(autouse=True)
def _sigint_state_per_test():
    """Each test starts with the SIGINT handler and interrupt record the session began with.

    An in-process run installs rltrain's SIGINT handler (it must, to never lose a Ctrl-C); left
    in place it would change what later tests of the interrupt rules observe.
    """
    import signal

    from rltrain.scheduler import interrupts

    before = signal.getsignal(signal.SIGINT)
    yield
    interrupts._RECEIVED.clear()
    if before is not None:
        signal.signal(signal.SIGINT, before)
    # a SIGTERM request left outside any run stops the next job of this worker at its start:
    # the test that leaves one fails here, not the unrelated test after it
    leaked = interrupts.termination_requested() and interrupts._DEPTH == 0
    interrupts._TERMINATE.clear()
    assert not leaked, "the test left a SIGTERM request recorded outside any run"


@pytest.fixture(autouse=True)
def _trace_state_per_test():
    """Each test starts with the span recorder as the session began: on, lane ``driver``.

    An in-process run sets the test process's recorder from its ``logging.trace`` (a driver
    process runs its jobs one after another, each setting it); left as the run set it, a later
    test that records spans in the test process would record none.
    """
    from rltrain.telemetry import trace

    before = (trace._process, trace._enabled)
    yield
    trace.configure(process=before[0], enabled=before[1])


@pytest.fixture(scope="session")
def ray_session() -> Iterator[RaySession]:
    """The test process's one local Ray (``tests/session_ray.py``), started on first use."""
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
