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
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra_plugins.rltrain_launcher._slices import Device
from rltrain.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RaySession:
    """The connection a sweep's jobs share.

    Attributes:
        address: the GCS address each job's driver connects to.
        node_ids: the jobs' cluster node rank -> Ray node id (empty for non-rltrain apps).
        free_gpus: the jobs' cluster node rank -> GPUs free there when the sweep connected
            (other Ray jobs' GPUs are not the sweep's to wait for).
    """

    address: str
    node_ids: Mapping[int, str] = field(default_factory=dict)
    free_gpus: Mapping[int, float] = field(default_factory=dict)


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

    temp_dir = tempfile.mkdtemp(prefix="rltrain-ray-")
    # Registered before ray.init so that it runs after Ray's own exit hook (LIFO).
    atexit.register(shutil.rmtree, temp_dir, True)
    defaults = {"include_dashboard": False, "_temp_dir": temp_dir, "logging_level": logging.WARNING}
    _ray_init(address="local", **{**defaults, **options})


#: The start of ray.init's message for keyword arguments it does not know.
_UNKNOWN = "Unknown keyword argument(s): "


def _ray_init(**kwargs: Any) -> None:
    """``ray.init``, an option it does not know named by its ``hydra.launcher.ray.init`` key.

    Raises:
        ConfigError: for an option ``ray.init`` does not take, naming the key and the fix.
    """
    import ray

    try:
        ray.init(**kwargs)
    except RuntimeError as exc:
        if not str(exc).startswith(_UNKNOWN):
            raise
        names = [n.strip() for n in str(exc)[len(_UNKNOWN) :].split(",") if n.strip()]
        keys = ", ".join(f"hydra.launcher.ray.init.{n}" for n in names)
        raise ConfigError(
            f"{keys}: not an option of ray.init (Ray {ray.__version__}); remove "
            f"{', '.join(f'+hydra.launcher.ray.init.{n}' for n in names)} from the command line "
            f"(the options are ray.init's keyword arguments)"
        ) from None


def connect(init: Mapping[str, Any], cluster: Mapping[str, Any] | None) -> RaySession:
    """Join or start the sweep's Ray cluster (started once per process, then reused).

    Args:
        init: ``hydra.launcher.ray.init`` (``ray.init`` keyword arguments).
        cluster: the jobs' common ``cluster`` section, or None for non-rltrain apps.

    Returns:
        The session.

    Raises:
        ConfigError: when ``init.address`` and ``cluster.address`` disagree, ``init`` options
            are given for a local Ray that the jobs' cluster config describes, or an ``init``
            option is not one of ``ray.init``.
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
        _ray_init(address=address, **{"logging_level": logging.WARNING, **options})
    elif cluster is not None:
        log.info("rltrain launcher: starting a private local Ray for the jobs' cluster config")
        _start_rltrain_cluster(cluster, options)
    else:
        log.info("rltrain launcher: starting a private local Ray")
        _start_plain(options)
    node_ids = _job_node_ids(cluster)
    free = free_gpus_per_node()
    return RaySession(
        address=ray.get_runtime_context().gcs_address,
        node_ids=node_ids,
        free_gpus={rank: free.get(node, 0.0) for rank, node in node_ids.items()},
    )


def _job_node_ids(cluster: Mapping[str, Any] | None) -> dict[int, str]:
    """The jobs' node ranks -> Ray node ids, as each job ranks them (empty when it cannot)."""
    import ray

    from rltrain.errors import RltrainError
    from rltrain.scheduler.discovery import job_nodes

    if cluster is None:
        return {}
    try:
        return {rank: n.node_id for rank, n in enumerate(job_nodes(ray.nodes(), cluster))}
    except RltrainError:  # too few nodes, bad labels: each job refuses it with the reason
        return {}


def free_gpus_per_node() -> dict[str, float]:
    """GPUs Ray has free now on each node, by node id (the GCS's view; no dashboard needed)."""
    import ray

    per_node = ray._private.state.available_resources_per_node()
    return {node: float(res.get("GPU", 0.0)) for node, res in per_node.items()}


def job_runtime_env(remote: Mapping[str, Any] | None, cluster: Mapping[str, Any] | None) -> dict:
    """The runtime_env each job's driver connects to Ray with, inherited by the job's workers.

    Args:
        remote: ``hydra.launcher.ray.remote.runtime_env``.
        cluster: the jobs' common ``cluster`` section (its ``runtime_env``), or None.

    Returns:
        Both merged; ``env_vars`` merged variable by variable.

    Raises:
        ConfigError: when both set one key or one variable to different values.
    """
    own = dict((cluster or {}).get("runtime_env") or {})
    out = dict(remote or {})
    clashes = []
    for key, value in own.items():
        if key == "env_vars" and isinstance(out.get(key), Mapping):
            for var, v in dict(value or {}).items():
                if out[key].get(var, v) != v:
                    clashes.append(f"env_vars.{var}: {out[key][var]!r} vs {v!r}")
            out[key] = {**out[key], **dict(value or {})}
        elif out.get(key, value) != value:
            clashes.append(f"{key}: {out[key]!r} vs {value!r}")
        else:
            out[key] = value
    if clashes:
        raise ConfigError(
            f"hydra.launcher.ray.remote.runtime_env and cluster.runtime_env both set "
            f"{'; '.join(clashes)}: each job's driver connects with both merged; set each key "
            f"in only one of them"
        )
    return out


def expected_free(
    free_at_start: Mapping[int, float], ended: Iterable[Device], running: Iterable[Device]
) -> dict[int, float]:
    """GPUs Ray should report free on the ended job's nodes once it has freed them.

    Args:
        free_at_start: node rank -> GPUs free when the sweep connected.
        ended: the ended job's slice's cluster devices.
        running: the cluster devices of the jobs still running.

    Returns:
        Node rank -> GPUs that should be free there (what was free at the start, less what the
        running jobs hold), for each node of ``ended``.
    """
    held = Counter(node for node, _ in running)
    return {node: max(0.0, free_at_start.get(node, 0.0) - held[node]) for node, _ in set(ended)}


def wait_devices_free(expected: Mapping[str, float], timeout_s: float) -> bool:
    """Wait until Ray reports, on each node, at least the GPUs ``expected`` free there.

    A finished job's driver has exited; Ray then removes its actors and placement groups (they
    are scoped to the driver's Ray job) within a moment. Waiting for that before admitting the
    next job keeps a sweep from seeing a stale, fuller cluster.

    Args:
        expected: Ray node id -> GPUs that should be free there (:func:`expected_free`).
        timeout_s: how long to wait.

    Returns:
        True when freed in time.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while not _all_free(expected):
        if time.monotonic() > deadline:
            return False
        # Ray has no event for "resources returned"; its resource view updates every ~100 ms.
        time.sleep(0.05)
    return True


def _all_free(expected: Mapping[str, float]) -> bool:
    free = free_gpus_per_node()
    return all(free.get(node, 0.0) + 1e-6 >= want for node, want in expected.items())
