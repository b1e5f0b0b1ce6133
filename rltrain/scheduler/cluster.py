"""The Ray cluster a job runs on, and everything the job created on it.

``Cluster.start(cfg.cluster)``:

- ``address: null`` (``cluster=local``) starts a local Ray bound to 127.0.0.1 with its own temp
  dir, no dashboard, no autoscaler monitor, and each node's dashboard agent on a free port
  (another Ray on the machine never makes it wait for Ray's fixed one). When the machine has
  no GPU and ``simulate_devices`` is true, each node declares ``devices_per_node`` Ray GPUs
  (simulated devices; ``torch.cuda.is_available()`` stays False in workers) with
  ``device_memory_gib`` each; a machine with real GPUs is never given simulated ones.
  ``num_nodes > 1`` simulates several nodes on this machine (``ray.cluster_utils.Cluster``).
- ``address: auto`` or ``host:port`` (``cluster=ray``) joins an existing cluster; nodes, devices
  and device memory are discovered (:mod:`rltrain.scheduler.discovery`).
- when Ray is already initialised in this process (tests, a Ray-hosted driver), it is reused and
  left running at shutdown.

Everything created through the cluster (reservations, worker groups, channels) is tracked;
:meth:`Cluster.release` removes it all, :meth:`Cluster.shutdown` also stops a Ray it started. Use
it as a context manager so an exception or Ctrl-C cleans up too.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rltrain.config.engine_checks import simulated_device_gib
from rltrain.errors import ConfigError, ResourceError
from rltrain.placement.types import ClusterSpec, Placement
from rltrain.scheduler.discovery import (
    MEMORY_LABEL,
    SLICE_ENV,
    apply_node_map,
    build_spec,
    job_nodes,
    slice_node_map,
)
from rltrain.scheduler.resources import ProcessAsk, tool_asks
from rltrain.telemetry import startup

if TYPE_CHECKING:
    from rltrain.scheduler.channel import Channel
    from rltrain.scheduler.group import WorkerGroup
    from rltrain.scheduler.reservation import Reservation
    from rltrain.telemetry.trace import Span

#: Makes Ray pick the loopback address for a local instance (read by ray._private.services).
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def _plain(value: Any) -> Any:
    """A DictConfig / dataclass value as plain Python (Ray pickles runtime_env)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return value


def nvml_gpu_count() -> int:
    """GPUs NVML counts on this machine (the library Ray's own detection uses).

    Raises:
        Exception: NVML's error when it cannot start (no driver library, a driver/library
            mismatch, no permission): the caller decides whether that means "no GPU".
    """
    import ray._private.thirdparty.pynvml as pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def local_gpu_count() -> int:
    """GPUs this machine gives the job: 0 on a machine without NVIDIA GPUs.

    The NVIDIA driver's device list (``/proc/driver/nvidia/gpus``) says whether GPUs are
    present; NVML says whether they can be used. Ray's own detection reports 0 when NVML fails,
    which would make a GPU machine silently run on simulated devices, so a machine whose driver
    lists GPUs that NVML cannot count is an error here. ``CUDA_VISIBLE_DEVICES`` limits the
    count (an empty value hides every GPU, as for Ray and CUDA).

    Raises:
        ResourceError: the driver lists GPUs but NVML fails or counts none, naming the cause.
    """
    from rltrain.config.engine_checks import driver_gpu_count

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return 0
    listed = driver_gpu_count()
    try:
        count = nvml_gpu_count()
    except Exception as exc:  # noqa: BLE001 - NVML's errors have no common base we may import
        if not listed:
            return 0  # no NVIDIA driver, no GPU: a CPU machine
        raise ResourceError(
            f"this machine's NVIDIA driver lists {listed} GPU(s) (/proc/driver/nvidia/gpus) "
            f"but NVML cannot use them ({type(exc).__name__}: {exc}): fix the driver install "
            f"(nvidia-smi shows the same error), or hide the GPUs with CUDA_VISIBLE_DEVICES='' "
            f"to run on simulated devices"
        ) from None
    if listed and count == 0:
        raise ResourceError(
            f"this machine's NVIDIA driver lists {listed} GPU(s) (/proc/driver/nvidia/gpus) "
            f"but NVML counts none: check nvidia-smi and the container's device access, or "
            f"hide the GPUs with CUDA_VISIBLE_DEVICES='' to run on simulated devices"
        )
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def _stop_started(local: Any) -> None:
    """Disconnect from the Ray a failed start brought up and stop its simulated nodes, Ctrl-C
    held until done; a failure here is logged, not raised over the start's own."""
    import ray

    from rltrain.scheduler.interrupts import deferred_interrupts

    with deferred_interrupts():
        for stop in (ray.shutdown, getattr(local, "shutdown", None)):
            if stop is None:
                continue
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - the start's error is the one to report
                logging.getLogger(__name__).warning("stopping a failed Ray start: %s", exc)


def _start_simulated_nodes(node_args: list[dict[str, Any]], temp: str) -> Any:
    """Start a local Ray of several nodes (``ray.cluster_utils.Cluster``) in ``temp``.

    Args:
        node_args: each node's arguments, the head's first.
        temp: the Ray temp dir this start owns.

    Returns:
        The started ``ray.cluster_utils.Cluster``, its nodes up.
    """
    from ray.cluster_utils import Cluster as LocalCluster

    # cluster_utils writes "the current cluster" file under Ray's default temp dir, where other
    # ray.init() calls on this machine would find and join it: keep it in our own temp dir.
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    os.makedirs(os.path.join(temp, "ray"), exist_ok=True)
    try:
        local = LocalCluster(
            initialize_head=True,
            head_node_args={
                **node_args[0],
                "temp_dir": temp,
                "include_dashboard": False,
                "_system_config": LOCAL_SYSTEM_CONFIG,
                **LOCAL_NODE_PARAMS,
            },
        )
        for args in node_args[1:]:
            local.add_node(**args, **LOCAL_NODE_PARAMS)
        local.wait_for_nodes()
    finally:
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
    return local


def _use_loopback() -> None:
    # A private local Ray on loopback: no auth token under ~/.ray, gloo on lo, no usage report
    # (setdefault: the user's own settings win).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray resolves 127.0.0.1 to the host's public address unless told it is not clustering;
    # a local job must not listen beyond loopback.
    os.environ[_LOOPBACK_ENV] = "0"
    import ray._private.ray_constants as constants

    constants.ENABLE_RAY_CLUSTER = False


#: Node parameters of a local Ray that ``ray.init`` has no argument for (Ray's own names).
#: Each node's dashboard agent listens on a port the OS picks: Ray gives every agent the fixed
#: HTTP port 52365 (Ray's job-submission endpoint, which rltrain does not use); when another
#: Ray on the machine holds it (a test session's, a sweep's, another user's, a second
#: simulated node) the agent retries binding for ~3.3 s, and the raylet waits for the agent
#: before the node joins. No autoscaler monitor (``ray start --no-monitor``, as KubeRay heads
#: run): a local Ray is a fixed set of nodes and rltrain asks no autoscaler anything; the
#: monitor is an interpreter that imports the autoscaler (~0.5 CPU-s per start on the 2-core
#: machine) and then polls the GCS every few seconds.
LOCAL_NODE_PARAMS: dict[str, Any] = {"dashboard_agent_listen_port": 0, "no_monitor": True}


@contextmanager
def _local_node_params() -> Iterator[None]:
    """Within: the parameters object ``ray.init`` builds defaults to :data:`LOCAL_NODE_PARAMS`.

    An explicit argument still wins (``setdefault``); a joined cluster is never started here.
    """
    import ray._private.parameter as parameter

    original = parameter.RayParams

    class _Params(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            for key, value in LOCAL_NODE_PARAMS.items():
                kwargs.setdefault(key, value)
            super().__init__(*args, **kwargs)

    parameter.RayParams = _Params  # type: ignore[misc]
    try:
        yield
    finally:
        parameter.RayParams = original  # type: ignore[misc]


#: Ray settings for a local Ray that rltrain starts itself (a joined cluster keeps its own).
#: Objects up to 1 MiB (Ray's default: 100 KiB) stay out of the shared-memory object store:
#: returned inline to their owner and inlined into the calls that take them. Weight versions
#: and rollout shards of small models are 0.1-1 MiB and cross every step; on the 2-core
#: development machine this made a default step 6-12 ms faster (three alternating pairs of
#: runs, e.g. 91.8 -> 85.1 ms). Larger
#: objects (real models' weights, big batches) still go through the object store.
#: Task events (what Ray's dashboard and ``ray list tasks`` show) are not reported: rltrain
#: records its own timeline, and the GCS keeps up to 100,000 events, growing by ~6 KiB per step
#: of a default run (measured: GCS RSS 50 -> 62 MiB over 2,000 steps; 56 -> 99 MiB over 12,000
#: calls with events, flat without).
#: No worker processes are prestarted when the driver connects: Ray starts one idle worker per
#: CPU for tasks, but every rltrain component is an actor placed in the job's placement group,
#: which got fresh processes of its own while the prestarted ones were killed as surplus — two
#: interpreters importing Ray for nothing (~1 CPU-second on the 2-core machine), competing with
#: the workers' start-up. Tasks still get workers on demand.
LOCAL_SYSTEM_CONFIG: dict[str, Any] = {
    "max_direct_call_object_size": 1024 * 1024,
    "task_events_report_interval_ms": 0,
    "prestart_worker_first_driver": False,
}


class Cluster:
    """A connection to Ray plus the resources one job created on it.

    Attributes:
        config: the ``cluster`` config section it was started from.
        spec: the discovered cluster (nodes in rank order, devices, memory, node groups).
        startup_timeout_s: limit for reservations and worker start-up.
        collective_timeout_s: timeout of worker process groups.
        runtime_env: ``cluster.runtime_env``, plain (empty when unset).
    """

    def __init__(self, config: Any, spec: ClusterSpec, owns_ray: bool, local: Any = None):
        self.config = config
        self.spec = spec
        self.startup_timeout_s = float(_get(config, "startup_timeout_s", 120.0))
        self.collective_timeout_s = float(_get(config, "collective_timeout_s", 300.0))
        self.runtime_env = dict(_plain(_get(config, "runtime_env")) or {})
        self._owns_ray = owns_ray
        self._local_cluster = local  # ray.cluster_utils.Cluster for simulated multi-node
        self._temp_dir: str | None = None
        self._groups: list[WorkerGroup[Any]] = []
        self._reservations: list[Reservation] = []
        self._channels: list[Channel] = []
        self._links: dict[str, set[str]] = {}
        self._closed = False
        # At interpreter exit (also after Ctrl-C) release what the job created.
        self._finalizer = weakref.finalize(self, Cluster._atexit_release, weakref.ref(self))

    @property
    def actor_runtime_env(self) -> dict | None:
        """What of ``cluster.runtime_env`` each worker is started with: the parts Ray's
        job-level environment lacks when the job joined a connection its driver made (a user's
        ``ray.init``; Ray merges a worker's own ``env_vars`` into the job's). Parts the job's
        connection already holds (the sweep launcher connects with them) are not passed again:
        a ``working_dir`` would be packaged anew per worker, from the job's working directory.
        None when the job connected with it, it is unset, or the job's holds all of it."""
        if self._owns_ray or not self.runtime_env:
            return None
        import ray

        job = dict(ray.get_runtime_context().runtime_env or {})
        out = {k: v for k, v in self.runtime_env.items() if k != "env_vars" and k not in job}
        have = job.get("env_vars") or {}
        env_vars = {
            k: v
            for k, v in (self.runtime_env.get("env_vars") or {}).items()
            if have.get(k) != str(v)
        }
        if env_vars:
            out["env_vars"] = env_vars
        return out or None

    # ---------------------------------------------------------------- start/join
    @classmethod
    def start(cls, config: Any = None, meanwhile: Callable[[], object] | None = None) -> Cluster:
        """Start or join Ray as ``config`` says and discover the cluster.

        Args:
            config: the ``cluster`` section (ClusterConfig, DictConfig or dict); None: defaults.
            meanwhile: work to do in a second thread while Ray starts (the driver's own
                imports): starting a local Ray is mostly waiting for its processes to come up.
                It has finished when this returns; what it raised is raised here, after the
                cluster is shut down. ``ray`` is imported before it starts; it must not import
                Ray's submodules, which Ray's start imports meanwhile: a module two threads
                import at once can be handed half-initialised to one of them (the runners'
                imports need none: ``tests/unit/scheduler/test_runner_imports.py``). A Ctrl-C
                while it runs is held until it has finished, then raised
                (:func:`rltrain.scheduler.interrupts.held_until_released`).

        Returns:
            The running cluster.

        Raises:
            ResourceError: when Ray cannot start, cannot be reached, or has too few nodes.
            ConfigError: for inconsistent cluster settings.
            KeyboardInterrupt: Ctrl-C during the start (the cluster is shut down first).
        """
        if meanwhile is None:
            return cls._start(config)
        # Ray itself is imported before the second thread starts (its submodules are left to
        # Ray's start in this thread)
        import ray  # noqa: F401

        from rltrain.scheduler import interrupts

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rltrain-meanwhile")
        cluster: Cluster | None = None
        try:
            # Ctrl-C is held while the second thread imports (a KeyboardInterrupt in this
            # thread meanwhile can leave the interpreter's import lock held, and the driver
            # would wait for that thread forever), then raised where this thread is
            with interrupts.held_until_released() as release:
                work = pool.submit(_then, meanwhile, release)
                cluster = cls._start(config)
                work.result()  # waits for the work to end; raises what it raised
        except BaseException:  # the work failed, or Ctrl-C came
            if cluster is not None:
                cluster.shutdown()
            raise
        finally:
            pool.shutdown(wait=True)  # never leave the work half-done at exit
        assert cluster is not None  # _start returned
        return cluster

    @classmethod
    def _start(cls, config: Any) -> Cluster:
        import ray

        if ray.is_initialized():
            return cls(config, cls._discover(config), owns_ray=False)
        address = _get(config, "address")
        runtime_env = _plain(_get(config, "runtime_env")) or None
        if address:
            try:
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ResourceError(
                    f"cluster.address={address!r}: cannot join the Ray cluster ({exc}). Start "
                    f"it with `ray start --head` (and `ray start --address=...` on other nodes) "
                    f"or use cluster=local"
                ) from None
            try:
                return cls(config, cls._discover(config), owns_ray=True)
            except BaseException:
                ray.shutdown()  # a disconnect: the joined cluster is not ours to stop
                raise
        return cls._start_local(config, runtime_env)

    @classmethod
    def _start_local(cls, config: Any, runtime_env: dict | None) -> Cluster:
        import time

        began = time.time()
        given = _get(config, "temp_dir")
        temp = given or tempfile.mkdtemp(prefix="rltrain-ray-", dir="/tmp")
        try:
            return cls._start_local_ray(config, runtime_env, temp)
        except BaseException:
            # Ctrl-C (or a failure) half-way through starting Ray: what it started so far must
            # not outlive the driver (an agent still importing would wait a minute for its GCS);
            # its temp dir goes once they are gone
            _end(_children_since(began))
            if not given:
                shutil.rmtree(temp, ignore_errors=True)
            raise

    @classmethod
    def _start_local_ray(cls, config: Any, runtime_env: dict | None, temp: str) -> Cluster:
        import ray

        num_nodes = int(_get(config, "num_nodes", 1))
        node_args = cls._local_node_args(config, num_nodes)  # refusals before anything starts
        _use_loopback()
        local = None
        if num_nodes == 1:
            with _local_node_params():
                ray.init(
                    address="local",  # never join another Ray instance running on this machine
                    include_dashboard=False,
                    _temp_dir=temp,
                    runtime_env=runtime_env,
                    _system_config=LOCAL_SYSTEM_CONFIG,
                    **node_args[0],
                )
        else:
            local = _start_simulated_nodes(node_args, temp)
            ray.init(address=local.address, runtime_env=runtime_env)
        try:
            cluster = cls(config, cls._discover(config), owns_ray=True, local=local)
        except BaseException:
            # discovery failed (a device probe, Ctrl-C): Ray is up but no Cluster will stop it
            _stop_started(local)
            raise
        cluster._temp_dir = None if _get(config, "temp_dir") else temp
        return cluster

    @staticmethod
    def _local_node_args(config: Any, num_nodes: int) -> list[dict[str, Any]]:
        per_node = _get(config, "devices_per_node", 2)
        if isinstance(per_node, Sequence) and not isinstance(per_node, str):
            devices = [int(d) for d in per_node]
        else:
            devices = [int(per_node)] * num_nodes
        if len(devices) != num_nodes:
            raise ConfigError(
                f"cluster.devices_per_node has {len(devices)} entries but cluster.num_nodes="
                f"{num_nodes}: give one entry per node"
            )
        real = local_gpu_count()
        if real and num_nodes > 1:
            # Each simulated node's raylet would detect every GPU of the machine as its own
            # 0..n-1: two "nodes" would hand out one physical GPU twice.
            raise ConfigError(
                f"cluster.num_nodes={num_nodes} with cluster.address=null simulates "
                f"{num_nodes} nodes on this machine, but it has {real} real GPU(s) and every "
                f"simulated node would use all of them: set cluster.num_nodes=1 "
                f"(cluster.devices_per_node={real}), start a multi-node Ray cluster and set "
                f"cluster.address, or hide the GPUs (CUDA_VISIBLE_DEVICES='') to simulate devices"
            )
        simulate = bool(_get(config, "simulate_devices", True)) and real == 0
        cpus = _get(config, "cpus_per_node") or os.cpu_count() or 1
        memory = str(simulated_device_gib(_get(config, "device_memory_gib", None)))
        out = []
        for d in devices:
            args: dict[str, Any] = {"num_cpus": int(cpus) if float(cpus).is_integer() else cpus}
            if simulate:
                args["num_gpus"] = d
                args["labels"] = {MEMORY_LABEL: memory}
            out.append(args)
        return out

    @staticmethod
    def _discover(config: Any) -> ClusterSpec:
        """The job's nodes, probed, in the job's ranks (a sweep job's slice renumbers them)."""
        import ray

        return Cluster._spec_from(ray.nodes(), config)

    @staticmethod
    def _spec_from(entries: Sequence[Mapping[str, Any]], config: Any) -> ClusterSpec:
        # Only the nodes the job uses are probed: a broken GPU node elsewhere in a shared
        # cluster (another tenant's) is none of the job's business.
        used = {n.node_id for n in job_nodes(entries, config or {})}
        timeout_s = float(_get(config, "startup_timeout_s", 120.0))
        memory = _measure_gpu_memory([e for e in entries if e["NodeID"] in used], timeout_s)
        spec = build_spec(entries, config or {}, memory)
        return apply_node_map(spec, slice_node_map(os.environ.get(SLICE_ENV)))

    # ------------------------------------------------------------- reservations
    def reserve(
        self,
        placements: Mapping[str, Sequence[Placement]] | Any,
        timeout_s: float | None = None,
        name: str | None = None,
        overlap: Sequence[frozenset[str]] = (),
        asks: Mapping[str, ProcessAsk] | None = None,
    ) -> Reservation:
        """Reserve, in one placement group, every device and CPU share the placements use.

        Args:
            placements: component name -> placements, or a plan with ``components`` and
                ``placements(component)``.
            timeout_s: how long Ray may take (default ``cluster.startup_timeout_s``).
            name: the placement group's name.
            overlap: sets of components whose stages run at the same time (their processes
                share a node's cores for torch threads instead of each taking all of them).
            asks: components whose processes ask fixed CPUs / memory (default: from a plan,
                its tool pool's ``tools.cpus_per_worker`` and ``tools.memory_gib_per_worker``).

        Returns:
            The reservation; launch groups into it with ``launch(..., reservation=...)``.

        Raises:
            ResourceError: when Ray cannot satisfy it in time (says what is missing).
        """
        from rltrain.scheduler.reservation import Reservation

        if not isinstance(placements, Mapping):
            if asks is None:
                asks = tool_asks(getattr(placements, "tools", None))
            placements = {c: list(placements.placements(c)) for c in placements.components}
        res = Reservation.create(
            placements,
            self.spec,
            self.startup_timeout_s if timeout_s is None else timeout_s,
            name,
            overlap,
            asks,
            self.node_devices(),
        )
        self._reservations.append(res)
        return res

    def node_devices(self) -> dict[int, tuple[int, ...]]:
        """Node rank -> the ids Ray gives its GPUs, for the nodes with real GPUs (a node whose
        raylet was started with ``CUDA_VISIBLE_DEVICES=2,3`` hands out GPUs 2 and 3)."""
        out = {}
        for node in self.spec.nodes:
            ids = gpu_ids(node.ray_node_id)
            if ids is not None:
                out[node.rank] = ids
        return out

    # --------------------------------------------------------------- registry
    # Worker groups and channels register here when launched, so the job can tear everything
    # down (release) and a failure can take its linked groups with it.
    def register_group(self, group: WorkerGroup[Any]) -> None:
        """Track a launched group (its launcher calls this)."""
        self._groups.append(group)

    def forget_group(self, group: WorkerGroup[Any]) -> None:
        """Stop tracking a group that was shut down (every view of it)."""
        self._groups = [g for g in self._groups if not g.same_group(group)]

    def register_channel(self, channel: Channel) -> None:
        """Track a created channel (its constructor calls this)."""
        self._channels.append(channel)

    def link(self, *group_names: str) -> None:
        """Record that groups share a collective: a failure in one tears the others down."""
        for a in group_names:
            self._links.setdefault(a, set()).update(n for n in group_names if n != a)

    def on_group_failure(self, name: str) -> None:
        """Tear down the group ``name`` and every group linked to it by a collective."""
        doomed, todo = set(), [name]
        while todo:
            n = todo.pop()
            if n not in doomed:
                doomed.add(n)
                todo.extend(self._links.get(n, ()))
        for g in list(self._groups):
            if g.name in doomed:
                g.terminate(f"torn down with group {name!r}")

    @property
    def groups(self) -> list[WorkerGroup[Any]]:
        """The live worker groups launched on this cluster."""
        return list(self._groups)

    def collect_spans(self) -> list[Span]:
        """Drain trace spans from every live group and from this (driver) process."""
        from rltrain.telemetry import trace

        spans = []
        for g in self._groups:
            if g.alive:
                spans.extend(g.collect_spans())
        return spans + trace.drain()

    # ---------------------------------------------------------------- teardown
    def release(self) -> None:
        """Kill every actor and remove every placement group this job created (Ray stays)."""
        for g in list(self._groups):
            g.shutdown()
        for ch in self._channels:
            ch.terminate()
        for res in self._reservations:
            res.remove()
        self._groups, self._channels, self._reservations = [], [], []

    def shutdown(self) -> None:
        """Release everything and stop Ray if this cluster started it (idempotent).

        Ctrl-C waits until it is done (then raises): a teardown cut short leaves processes.
        """
        if self._closed:
            return
        self._closed = True
        import ray

        from rltrain.scheduler.interrupts import deferred_interrupts

        with deferred_interrupts():
            try:
                if ray.is_initialized():
                    self.release()
            finally:
                if self._owns_ray:
                    started = self._started_processes()
                    ray.shutdown()
                    if self._local_cluster is not None:
                        self._local_cluster.shutdown()
                    _end(started)
                    if self._temp_dir:
                        shutil.rmtree(self._temp_dir, ignore_errors=True)
                self._finalizer.detach()
                startup.mark("teardown")

    def _started_processes(self) -> list[Any]:
        """Every process of the local Ray this cluster started, with their descendants (the
        agents and workers its raylet started): ``ray.shutdown`` stops the ones Ray tracks,
        and an agent still starting up when it does would wait a minute for its GCS."""
        if _get(self.config, "address"):
            return []  # a joined cluster's processes are not ours
        import psutil
        import ray._private.worker as ray_worker

        nodes = [getattr(ray_worker, "_global_node", None)]
        if self._local_cluster is not None:
            nodes += list(self._local_cluster.list_all_nodes())
        found: dict[int, Any] = {}
        for node in nodes:
            for infos in (getattr(node, "all_processes", None) or {}).values():
                for info in infos:
                    try:
                        root = psutil.Process(info.process.pid)
                        for p in (root, *root.children(recursive=True)):
                            found[p.pid] = p
                    except (psutil.Error, AttributeError):
                        continue
        return list(found.values())

    @staticmethod
    def _atexit_release(ref: weakref.ref[Cluster]) -> None:
        cluster = ref()
        if cluster is not None:
            cluster.shutdown()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _children_since(began: float) -> list[Any]:
    """This process's descendants created at or after ``began`` (seconds since the epoch)."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.create_time() >= began - 1.0:  # create_time has a tick's resolution
                out.append(p)
        except psutil.Error:
            continue
    return out


def _alive(process: Any) -> bool:
    """Running and not a zombie (a zombie is gone; only its parent's wait is left)."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _end(processes: list[Any], grace_s: float = 5.0) -> None:
    """Terminate what is still running of ``processes``, then kill what outlives the grace."""
    import psutil

    alive = [p for p in processes if _alive(p)]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            continue
    _, stubborn = psutil.wait_procs(alive, timeout=grace_s)
    for p in stubborn:
        try:
            p.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(stubborn, timeout=grace_s)


def _then(work: Callable[[], object], release: Callable[[], None]) -> object:
    """Run ``work``, then ``release`` (whatever ``work`` did)."""
    try:
        return work()
    finally:
        release()


#: Device memory of the GPU nodes this process has probed, by Ray node id: a node's devices do
#: not change while it lives, and a driver discovers its cluster more than once (the attempt's
#: Ray, then the job joining it), each probe a worker process importing torch on that node.
_GPU_MEMORY: dict[str, int] = {}
#: The GPU ids Ray hands out on each probed node (see :func:`node_gpu_ids`), by Ray node id.
_GPU_IDS: dict[str, tuple[int, ...]] = {}


def gpu_ids(node_id: str | None) -> tuple[int, ...] | None:
    """The GPU ids Ray hands out on a probed node with real GPUs; None for any other node."""
    return _GPU_IDS.get(node_id or "")


def node_gpu_ids(visible: Sequence[str] | None, num_gpus: int) -> tuple[int, ...]:
    """The ids of a node's GPUs as Ray hands them out, in Ray's order.

    Ray numbers a node's GPUs by its raylet's ``CUDA_VISIBLE_DEVICES`` (a SLURM allocation or a
    shared host gives it e.g. ``2,3``): slot ``i`` is id ``visible[i]``; without it, ``i``.

    Args:
        visible: the raylet's ``CUDA_VISIBLE_DEVICES`` entries, or None when it was unset.
        num_gpus: the GPUs Ray schedules on the node.

    Returns:
        ``num_gpus`` device ids.

    Raises:
        ValueError: for an entry that is not a number (a GPU UUID).
    """
    if visible is None:
        return tuple(range(num_gpus))
    return tuple(int(v) for v in list(visible)[:num_gpus])


def _probe_node() -> tuple[int, list[str] | None] | str:
    """Run on a GPU node: its smallest device's memory and the raylet's visible GPU ids, or
    why torch cannot use the GPUs there."""
    import ray._private.worker as ray_worker

    try:
        memory = cuda_device_memory()
    except ResourceError as exc:  # reported by the driver, naming the node
        return str(exc)
    visible = ray_worker.global_worker.original_visible_accelerator_ids.get("GPU")
    return memory, None if visible is None else [str(v) for v in visible]


def _measure_gpu_memory(
    entries: Sequence[Mapping[str, Any]], timeout_s: float = 120.0
) -> dict[str, int]:
    """Memory per device of the given nodes with real GPUs, by node id (one probe task per such
    node not probed before); also records each one's GPU ids (:func:`gpu_ids`).

    Args:
        entries: ``ray.nodes()`` entries of the nodes the job uses.
        timeout_s: how long the probes may take (``cluster.startup_timeout_s``).

    Returns:
        Node id -> memory of its smallest device, in bytes.

    Raises:
        ResourceError: a probed node cannot use its GPUs, or its probe did not answer in time,
            naming the node.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    gpu = {
        e["NodeID"]: e
        for e in entries
        if e.get("Alive") and any(k.startswith("accelerator_type:") for k in e["Resources"])
    }
    nodes = [n for n in gpu if n not in _GPU_MEMORY]
    if nodes:
        probe = ray.remote(num_cpus=0, num_gpus=0, max_retries=0)(_probe_node)
        refs = [
            probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)
            ).remote()
            for n in nodes
        ]
        problems = _record(gpu, nodes, _answers(refs, timeout_s))
        if problems:
            raise ResourceError(
                "; ".join(problems) + ": the job uses this node (one of the first "
                "cluster.num_nodes in cluster.node_order); fix it, or take it out of the Ray "
                "cluster"
            )
    return {n: _GPU_MEMORY[n] for n in gpu}


def _record(
    gpu: Mapping[str, Mapping[str, Any]], nodes: Sequence[str], answers: Sequence[Any]
) -> list[str]:
    """Keep what each node's probe measured; return what is wrong with the others."""
    problems = []
    for n, answer in zip(nodes, answers, strict=True):
        where = f"node {n[:12]} ({gpu[n].get('NodeManagerAddress', '?')})"
        if isinstance(answer, str):
            problems.append(f"{where} reports GPUs to Ray, but {answer}")
            continue
        try:
            _GPU_IDS[n] = node_gpu_ids(answer[1], int(gpu[n]["Resources"].get("GPU", 0)))
        except ValueError:
            problems.append(
                f"{where}: its raylet's CUDA_VISIBLE_DEVICES={','.join(answer[1] or [])} "
                f"names GPUs by UUID; start Ray there with numeric GPU ids"
            )
            continue
        _GPU_MEMORY[n] = answer[0]
    return problems


def _answers(refs: Sequence[Any], timeout_s: float) -> list[Any]:
    """Each probe's answer, or a sentence saying why there is none."""
    import ray

    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    out: list[Any] = []
    for ref in refs:
        if ref not in done:
            ray.cancel(ref, force=True)
            out.append(
                f"its probe did not answer within {timeout_s:g} s (cluster.startup_timeout_s): "
                f"the node may be out of CPUs or memory, or slow to start a worker"
            )
            continue
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            out.append(f"its probe failed ({type(exc).__name__}: {first})")
    return out


def cuda_device_memory() -> int:
    """Memory of the smallest CUDA device this process sees, in bytes.

    Raises:
        ResourceError: torch cannot use CUDA here (not built with it, no driver, a driver too
            old for its CUDA) or sees no device, naming the cause.
    """
    import torch

    try:
        torch.cuda.init()
        count = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001 - torch raises several types for one cause
        raise ResourceError(
            f"torch cannot use CUDA there ({type(exc).__name__}: {exc}): install a CUDA build "
            f"of torch matching the driver (torch.cuda.is_available() must be True)"
        ) from None
    if count == 0:
        raise ResourceError(
            "torch sees no CUDA device there (torch.cuda.device_count() == 0): check "
            "CUDA_VISIBLE_DEVICES and the driver"
        )
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
