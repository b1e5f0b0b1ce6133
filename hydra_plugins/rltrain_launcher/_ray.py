"""The sweep's one Ray cluster: join the configured address, or start a private local Ray.

Never ``ray.init()`` without an address: Ray would then join whatever instance it finds on the
machine (hydra-ray-launcher 1.2.2's pitfall). A local Ray started here is ours alone: its own
temp dir, no dashboard, the simulated devices of the jobs' ``cluster`` config, shut down when the
process exits (kept across batches, which sweepers such as Optuna launch one after another).
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rltrain.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RaySession:
    """The connection a sweep's jobs share.

    Attributes:
        address: the GCS address each job's driver connects to.
        gpus: GPUs (real or simulated) the cluster reports.
    """

    address: str
    gpus: float


_CLUSTER: Any = None  # the rltrain Cluster handle of a local Ray started for the sweep


def _start_rltrain_cluster(cluster: Mapping[str, Any], options: Mapping[str, Any]) -> None:
    """Start the local Ray the jobs' ``cluster`` config describes, as a single run would.

    ``rltrain.scheduler.Cluster`` binds it to loopback, gives it a private temp dir, declares the
    simulated devices and their memory, and simulates several nodes when ``num_nodes > 1``.
    """
    global _CLUSTER
    if options:
        keys = ", ".join(f"hydra.launcher.ray.init.{k}" for k in options)
        raise ConfigError(
            f"{keys}: with cluster.address=null the sweep's local Ray is started from the jobs' "
            "cluster config (cluster.devices_per_node, cluster.cpus_per_node, ...); set those "
            "instead, or start Ray yourself and set cluster.address"
        )
    from rltrain.scheduler import Cluster

    # Kept referenced for the whole process: the handle shuts Ray down when it is finalised.
    _CLUSTER = Cluster.start(dict(cluster))


def _start_plain(options: Mapping[str, Any]) -> None:
    """A private local Ray for apps that are not rltrain (no devices declared)."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="rltrain-ray-")
    # Registered before ray.init so that it runs after Ray's own exit hook (LIFO).
    atexit.register(shutil.rmtree, temp_dir, True)
    defaults = {"include_dashboard": False, "_temp_dir": temp_dir, "logging_level": logging.WARNING}
    ray.init(address="local", **{**defaults, **options})


def connect(init: Mapping[str, Any], cluster: Mapping[str, Any] | None) -> RaySession:
    """Join or start the sweep's Ray cluster (started once per process, then reused).

    Args:
        init: ``hydra.launcher.ray.init`` (``ray.init`` keyword arguments).
        cluster: the jobs' common ``cluster`` section, or None for non-rltrain apps.

    Returns:
        The session.

    Raises:
        ConfigError: when ``init.address`` and ``cluster.address`` disagree, or ``init`` options
            are given for a local Ray that the jobs' cluster config describes.
        ResourceError: when the local Ray cannot start.
    """
    import ray

    options = {k: v for k, v in init.items() if v is not None}
    address = options.pop("address", None)
    wanted = (cluster or {}).get("address")
    if address and wanted and address != wanted:
        raise ConfigError(
            f"hydra.launcher.ray.init.address={address!r} but cluster.address={wanted!r}: the "
            "sweep and its jobs use one cluster; set only one of them, or make them equal"
        )
    address = address or wanted
    if ray.is_initialized():
        log.debug("rltrain launcher: using the Ray instance this process is connected to")
    elif address:
        log.info("rltrain launcher: joining the Ray cluster at %s", address)
        ray.init(address=address, **{"logging_level": logging.WARNING, **options})
    elif cluster is not None:
        log.info("rltrain launcher: starting a private local Ray for the jobs' cluster config")
        _start_rltrain_cluster(cluster, options)
    else:
        log.info("rltrain launcher: starting a private local Ray")
        _start_plain(options)
    return RaySession(
        address=ray.get_runtime_context().gcs_address,
        gpus=float(ray.cluster_resources().get("GPU", 0.0)),
    )


def wait_devices_free(expected_free: float, timeout_s: float) -> bool:
    """Wait until Ray reports at least ``expected_free`` GPUs available.

    A finished job's driver has exited; Ray then removes its actors and placement groups (they
    are scoped to the driver's Ray job) within a moment. Waiting for that before admitting the
    next job keeps a sweep from seeing a stale, fuller cluster.

    Args:
        expected_free: GPUs that should be free (those no running job may hold).
        timeout_s: how long to wait.

    Returns:
        True when freed in time.
    """
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("GPU", 0.0) + 1e-6 < expected_free:
        if time.monotonic() > deadline:
            return False
        # Ray has no event for "resources returned"; its resource view updates every ~100 ms.
        time.sleep(0.05)
    return True
