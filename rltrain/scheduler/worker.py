"""The :class:`Worker` base class, the per-process context the runtime gives it, and the host.

A worker class stays a plain Python class: ``MyWorker()`` works in a unit test (rank 0 of 1, no
devices) and ``MyWorker.create_group(...).launch(cluster, name=..., placement_strategy=...)`` runs
one Ray actor per placement. The runtime makes the actor from a subclass that mixes in
:class:`_Host` (set the environment, then call the user's ``__init__``) — the user's class is
never changed.

Nothing here imports torch: workers that do not need it start without it.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from rltrain.placement.types import Placement

if TYPE_CHECKING:
    from rltrain.scheduler.group import WorkerGroupBuilder

W = TypeVar("W", bound="Worker")

#: Ray must not set CUDA_VISIBLE_DEVICES in our actors: the runtime sets it from the plan.
NOSET_CUDA_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class WorkerContext:
    """Who and where a worker process is.

    Attributes:
        group: the worker group's name.
        rank: the process's rank in its group.
        world_size: processes in the group.
        placement: the plan's placement of the process (None outside the runtime).
        devices: device indices to use inside the process, i.e. positions in
            ``CUDA_VISIBLE_DEVICES`` (``(0,)`` for an isolated one-device process). Empty for a
            process placed on a node or on other hardware: it reserves no device, yet sees its
            node's devices in ``CUDA_VISIBLE_DEVICES`` (RLinf's meaning).
        device_labels: the plan devices as trace lanes (``node0/dev1``).
        physical_devices: the devices Ray reserved for the process (ids on its node).
        env: the environment variables the runtime set.
        num_threads: torch / OpenMP threads for the process (None: leave as is).
    """

    group: str = "local"
    rank: int = 0
    world_size: int = 1
    placement: Placement | None = None
    devices: tuple[int, ...] = ()
    device_labels: tuple[str, ...] = ()
    physical_devices: tuple[int, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    num_threads: int | None = None


def set_num_threads(n: int) -> None:
    """Set torch's and OpenMP's thread count (torch only if the process already imported it)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)


class Worker:
    """Base class of every component worker.

    Subclasses implement plain methods; public ones become callable on the group
    (``group.method(...).wait()``). Inside a method, ``self.rank``, ``self.world_size``,
    ``self.placement`` and ``self.devices`` say who and where the process is.
    """

    _rltrain_ctx: WorkerContext = WorkerContext()

    @property
    def rank(self) -> int:
        """The process's rank in its group (0 outside the runtime)."""
        return self._rltrain_ctx.rank

    @property
    def world_size(self) -> int:
        """Processes in the group (1 outside the runtime)."""
        return self._rltrain_ctx.world_size

    @property
    def group_name(self) -> str:
        """The worker group's name (``local`` outside the runtime)."""
        return self._rltrain_ctx.group

    @property
    def placement(self) -> Placement | None:
        """The plan's placement of this process (None outside the runtime)."""
        return self._rltrain_ctx.placement

    @property
    def devices(self) -> tuple[int, ...]:
        """Device indices to use in this process (positions in ``CUDA_VISIBLE_DEVICES``)."""
        return self._rltrain_ctx.devices

    @property
    def device_labels(self) -> tuple[str, ...]:
        """The plan devices of this process as trace lanes, for ``trace.span(...)``."""
        return self._rltrain_ctx.device_labels

    def collective(self, name: str) -> Any:
        """The standalone process group ``name`` this worker joined (see ``create_collective``).

        Raises:
            KeyError: when the worker is not a member of that collective.
        """
        groups = getattr(self, "_rltrain_collectives", {})
        if name not in groups:
            raise KeyError(
                f"{self.group_name}[{self.rank}] is not in collective {name!r} (it is in "
                f"{sorted(groups)}): create it with rltrain.scheduler.create_collective"
            )
        return groups[name]

    @classmethod
    def create_group(cls: type[W], *args: Any, **kwargs: Any) -> WorkerGroupBuilder[W]:
        """Prepare a group of this worker; ``args``/``kwargs`` go to every rank's ``__init__``.

        Returns:
            A builder; call ``.launch(cluster, name=..., placement_strategy=...)`` on it.
        """
        from rltrain.scheduler.group import WorkerGroupBuilder

        return WorkerGroupBuilder(cls, args, kwargs)


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def quiet_third_party_warnings() -> None:
    """Keep libraries' deprecation notices out of the driver's terminal.

    Ray forwards every worker's stderr to the driver: a FutureWarning of a library a worker uses
    (transformers' ``past_key_values`` notice, for one) would repeat once per worker process on
    every run. Deprecations raised by rltrain's own code still show; set
    ``RLTRAIN_LIBRARY_WARNINGS=1`` to see the libraries' too.
    """
    if os.environ.get("RLTRAIN_LIBRARY_WARNINGS") == "1":
        return
    import warnings

    for category in (DeprecationWarning, FutureWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("default", category=category, module=r"rltrain(\.|$)")
    # transformers reports its deprecations through its own logger, and draws a progress bar
    # for every checkpoint it writes
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import sys

    if "transformers" in sys.modules:  # imported while Ray loaded the worker's class
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


class _Host:
    """Mixed in front of a worker class to make the Ray actor class (see ``host_class``)."""

    def __init__(
        self, ctx: WorkerContext, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        from rltrain.telemetry import startup, trace

        startup.mark("worker_init_begin", f"{ctx.group}[{ctx.rank}]")
        os.environ.update(ctx.env)
        quiet_third_party_warnings()
        if ctx.num_threads:
            set_num_threads(ctx.num_threads)
        self._rltrain_ctx = ctx
        self._rltrain_collectives: dict[str, Any] = {}
        trace.configure(process=f"{ctx.group}[{ctx.rank}]")
        super().__init__(*args, **kwargs)
        # The user's __init__ may have imported torch (which resets its thread count).
        if ctx.num_threads:
            set_num_threads(ctx.num_threads)
        startup.mark("worker_init_end", f"{ctx.group}[{ctx.rank}]")

    def _rltrain_ready(self) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    def _rltrain_free_port(self) -> int:
        return free_port()

    def _rltrain_set_env(self, env: Mapping[str, str]) -> None:
        os.environ.update(env)
        self._rltrain_ctx = _with_env(self._rltrain_ctx, env)

    def _rltrain_set_num_threads(self, n: int) -> None:
        set_num_threads(n)

    def _rltrain_open_store(self, world_size: int, timeout_s: float) -> tuple[str, int]:
        from rltrain.scheduler import collective

        return collective.open_store(self, world_size, timeout_s)

    def _rltrain_init_process_group(self, **kw: Any) -> None:
        from rltrain.scheduler import collective

        collective.init_default_group(self, **kw)

    def _rltrain_join_collective(self, **kw: Any) -> None:
        from rltrain.scheduler import collective

        collective.join_collective(self, **kw)

    def _rltrain_trace(self, enabled: bool) -> None:
        from rltrain.telemetry import trace

        trace.configure(enabled=enabled)
        if not enabled:
            trace.drain()  # what __init__ recorded would stay in the buffer, never written

    def _rltrain_drain_spans(self) -> list[Any]:
        from rltrain.telemetry import trace

        return trace.drain()

    def _rltrain_format_exc(self) -> str:
        return traceback.format_exc()


def _with_env(ctx: WorkerContext, env: Mapping[str, str]) -> WorkerContext:
    from dataclasses import replace

    return replace(ctx, env={**ctx.env, **env})


_HOSTS: dict[type, type] = {}


def host_class(cls: type[Worker]) -> type:
    """The actor class for ``cls``: ``cls`` with :class:`_Host` in front (cached)."""
    if cls not in _HOSTS:
        _HOSTS[cls] = type(cls.__name__, (_Host, cls), {"__module__": cls.__module__})
    return _HOSTS[cls]
