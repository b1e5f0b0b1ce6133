"""Worker groups: one Ray actor per placement, group calls with futures, failure handling.

Calls name the method, never a string: ``group.call(MyWorker.method, *args)`` is fully typed
(arguments checked against the method, ``wait()`` returns ``list[R]``) and "go to definition"
lands on ``MyWorker.method``. RLinf's shorthand ``group.method(*args)`` (attribute lookup by name)
is deliberately not offered: static tools cannot see through it.

A failure in any rank (an exception, an exception in the worker's ``__init__``, the process
dying, or a failed input: another worker's call whose result was passed in) surfaces at
``wait()`` as a :class:`WorkerError` naming group, rank, node, devices and the remote traceback;
a failed input is blamed on the worker that raised it. The group, and every group linked to it
by a collective, is then torn down: siblings blocked in a collective are killed instead of
waiting out the collective timeout.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar

import ray

from rltrain.errors import PlacementError, ResourceError, WorkerError
from rltrain.placement.types import Placement
from rltrain.scheduler.worker import NOSET_CUDA_ENV, W, Worker, WorkerContext, host_class
from rltrain.telemetry.trace import device_label

if TYPE_CHECKING:
    from rltrain.scheduler.cluster import Cluster
    from rltrain.scheduler.reservation import Reservation
    from rltrain.scheduler.resources import ProcessAsk
    from rltrain.telemetry.trace import Span

P = ParamSpec("P")
R = TypeVar("R")


class CallTimeoutError(WorkerError, TimeoutError):
    """``wait(timeout=...)`` expired before every rank answered (the workers keep running)."""


@dataclass(frozen=True)
class RemoteFailure:
    """What a Ray error from a group call says failed (:func:`read_failure`).

    Attributes:
        kind: ``raised`` (the called method raised), ``init`` (the worker's ``__init__``
            raised), ``died`` (the process died) or ``input`` (another task or actor call
            whose result was passed to the call raised).
        cause: the exception the worker code raised (None when a process died).
        task: for ``input``, the failed call as Ray names it (``RewardWorker.score``).
        actor_id: for ``input``, the Ray actor id (hex) of the worker that raised; for
            ``died``, that of the worker whose process died (another worker's when the call's
            input came from it).
        pid: for ``input``, that worker's process id.
        ip: for ``input``, that worker's node address.
    """

    kind: str
    cause: BaseException | None = None
    task: str = ""
    actor_id: str = ""
    pid: int | None = None
    ip: str = ""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray's text for a call whose argument came from a failed call: the failed call's header follows.
_FAILED_INPUT = re.compile(
    r"At least one of the input arguments for this task could not be computed:\s*\n"
    r"(?:\S+: )?ray::(?P<task>[\w.]+)\(\) \(pid=(?P<pid>\d+), ip=(?P<ip>[^,)]+)"
    r"(?:, actor_id=(?P<actor_id>[0-9a-f]+))?"
)


def read_failure(exc: BaseException) -> RemoteFailure:
    """Read what failed from the Ray error a group call raised.

    Ray reports an exception in an actor's ``__init__`` as the actor's death
    (``ActorDiedError`` with ``actor_init_failed``; the creation task's ``RayTaskError`` is its
    first argument), and an exception in a call whose result was passed to another call as an
    exception of that other call (only its text names the call that raised).

    Args:
        exc: the error ``ray.get`` raised.

    Returns:
        The failure's kind and the worker's exception; for a failed input, which call raised.
    """
    errors = ray.exceptions
    if isinstance(exc, errors.RayActorError) and exc.actor_init_failed:
        task_error = next((a for a in exc.args if isinstance(a, errors.RayTaskError)), None)
        return RemoteFailure("init", getattr(task_error, "cause", None))
    if isinstance(exc, errors.RayActorError):
        # A call whose input came from a worker that died fails with that worker's death
        # (its actor id), not with one of its own.
        return RemoteFailure("died", actor_id=exc.actor_id or "")
    cause = getattr(exc, "cause", None)
    found = list(_FAILED_INPUT.finditer(_ANSI.sub("", str(exc))))
    if isinstance(exc, errors.RayTaskError) and found:
        origin = found[-1]  # a chain of failed inputs lists the call that raised last
        return RemoteFailure(
            "input",
            cause,
            origin["task"],
            origin["actor_id"] or "",
            int(origin["pid"]),
            origin["ip"],
        )
    return RemoteFailure("raised", cause)


def one_line(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one line (the message's first line, cut at 200)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    text = text if len(text) <= 200 else text[:199] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True)
class WorkerInfo:
    """The identity of one worker process, used in every error about it."""

    group: str
    rank: int
    node_rank: int
    ip: str
    node_id: str = ""
    devices: tuple[str, ...] = ()
    physical_devices: tuple[int, ...] = ()
    pid: int | None = None

    def describe(self) -> str:
        """``group 'actor' rank 1 (node 0 127.0.0.1 id ab12.., devices [...] ...)``."""
        devs = f"devices {list(self.devices)} -> physical {list(self.physical_devices)}"
        return (
            f"group {self.group!r} rank {self.rank} (node {self.node_rank} {self.ip} id "
            f"{self.node_id[:12]}, {devs if self.devices else 'no devices'}, pid {self.pid})"
        )


def resolve_placements(
    strategy: Any, spec: Any, isolate_accelerator: bool, where: str
) -> list[Placement]:
    """Placements from a strategy (``get_placement(spec, isolate)``) or a list of placements.

    Raises:
        PlacementError: for anything else, or an empty list.
    """
    if hasattr(strategy, "get_placement"):
        placements = list(strategy.get_placement(spec, isolate_accelerator))
    elif isinstance(strategy, Sequence) and all(isinstance(p, Placement) for p in strategy):
        placements = list(strategy)
    else:
        raise PlacementError(
            f"{where}: placement_strategy={strategy!r} is neither a placement strategy (with "
            f"get_placement(cluster, isolate_accelerator)) nor a list of Placement"
        )
    if not placements:
        raise PlacementError(f"{where}: the placement strategy produced no processes")
    if sorted(p.rank for p in placements) != list(range(len(placements))):
        raise PlacementError(
            f"{where}: process ranks {[p.rank for p in placements]} must be "
            f"0..{len(placements) - 1}"
        )
    return sorted(placements, key=lambda p: p.rank)


@dataclass
class _State:
    """What every view (``execute_on``) of one group shares."""

    name: str
    cls: type
    cluster: Cluster
    placements: list[Placement]
    reservation: Reservation
    owns_reservation: bool
    actors: list[Any] = field(default_factory=list)
    infos: list[WorkerInfo] = field(default_factory=list)
    failed: str | None = None
    closed: bool = False


class GroupFuture(Generic[R]):
    """The pending results of one group call; ``wait()`` returns them in rank order."""

    def __init__(self, group: WorkerGroup[Any], ranks: Sequence[int], refs: list[Any], method: str):
        self._group = group
        self._ranks = tuple(ranks)
        self._refs = refs
        self._method = method

    @property
    def refs(self) -> list[Any]:
        """The Ray object refs, rank order: pass them to another group without fetching data."""
        return list(self._refs)

    def done(self) -> bool:
        """Whether every rank has answered (successfully or not)."""
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def wait(self, timeout: float | None = None, timeout_key: str | None = None) -> list[R]:
        """Block until every rank answered; fail fast on the first failure.

        Args:
            timeout: seconds to wait at most (None: no limit).
            timeout_key: the config key ``timeout`` comes from, named in the timeout's message
                with its fix (None: a caller's own wait, which may wait again).

        Returns:
            One result per called rank, in rank order.

        Raises:
            WorkerError: when a rank raised or its process died (the group is torn down).
            CallTimeoutError: when ``timeout`` expired first.
        """
        if len(self._refs) == 1:  # the common no-fan-out case: one round trip
            try:
                return [ray.get(self._refs[0], timeout=timeout)]
            except ray.exceptions.GetTimeoutError:
                raise self._timeout(timeout, [self._ranks[0]], timeout_key) from None
            except ray.exceptions.RayError as exc:
                raise self._group._fail(self._ranks[0], self._method, exc) from None
        index = {ref: i for i, ref in enumerate(self._refs)}
        results: list[Any] = [None] * len(self._refs)
        pending = list(self._refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                raise self._timeout(timeout, [self._ranks[index[r]] for r in pending], timeout_key)
            i = index[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                raise self._group._fail(self._ranks[i], self._method, exc) from None
        return results

    def _timeout(
        self, timeout: float | None, ranks: list[int], key: str | None = None
    ) -> CallTimeoutError:
        where = f"group {self._group.name!r}.{self._method}: ranks {ranks} did not answer within"
        if key is None:
            return CallTimeoutError(
                f"{where} {timeout} s; they keep running: wait again, or shut the group down"
            )
        return CallTimeoutError(
            f"{where} {timeout:g} s (set from {key}): raise {key} if they are slow (a large model "
            f"loading, a loaded machine), or read the ranks' log lines above for what holds them"
        )


class WorkerGroup(Generic[W]):
    """One Ray actor per placement of a component; call worker methods on all or some ranks."""

    def __init__(self, state: _State, ranks: Sequence[int] | None = None):
        self._state = state
        self._ranks = tuple(range(len(state.placements)) if ranks is None else ranks)

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        return self._state.name

    @property
    def world_size(self) -> int:
        """Processes in the whole group (not just this view)."""
        return len(self._state.placements)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks this view calls."""
        return self._ranks

    @property
    def worker_class(self) -> type:
        """The :class:`~rltrain.scheduler.Worker` subclass every rank runs."""
        return self._state.cls

    @property
    def placements(self) -> list[Placement]:
        return list(self._state.placements)

    @property
    def workers(self) -> list[WorkerInfo]:
        """Identity (node, devices, pid) of every rank."""
        return list(self._state.infos)

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, rank order (for passing to other workers)."""
        return list(self._state.actors)

    @property
    def reservation(self) -> Reservation:
        return self._state.reservation

    # --------------------------------------------------------------------- calls
    def call(
        self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> GroupFuture[R]:
        """Call ``method`` (e.g. ``MyWorker.step``) with the same arguments on every rank.

        Returns:
            A future; ``.wait()`` gives the results in rank order.
        """
        return self._submit(self._method_name(method), [(args, kwargs)] * len(self._ranks))

    def call_each(
        self, method: Callable[..., R], per_rank: Sequence[tuple[Any, ...]]
    ) -> GroupFuture[R]:
        """Call ``method`` with different positional arguments per rank.

        Args:
            method: a method of the worker class.
            per_rank: one tuple of arguments per rank of this view, in rank order.

        Raises:
            WorkerError: when ``per_rank`` does not have one entry per rank.
        """
        if len(per_rank) != len(self._ranks):
            raise WorkerError(
                f"group {self.name!r}.call_each got {len(per_rank)} argument tuples for "
                f"{len(self._ranks)} ranks: give one per rank"
            )
        return self._submit(self._method_name(method), [(tuple(a), {}) for a in per_rank])

    def execute_on(self, *ranks: int) -> WorkerGroup[W]:
        """A view of this group that calls only ``ranks``.

        Raises:
            WorkerError: for a rank outside the group.
        """
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad or not ranks:
            raise WorkerError(
                f"group {self.name!r}.execute_on{ranks}: ranks must be in 0..{self.world_size - 1}"
            )
        return WorkerGroup(self._state, ranks)

    def _method_name(self, method: Callable[..., Any]) -> str:
        name = getattr(method, "__name__", None)
        if name is None or not callable(getattr(self._state.cls, name, None)):
            raise WorkerError(
                f"group {self.name!r}: {method!r} is not a method of {self._state.cls.__name__}"
            )
        return name

    def _submit(self, name: str, per_rank: list[tuple[tuple, dict]]) -> GroupFuture[Any]:
        self._check_usable()
        refs = [
            getattr(self._state.actors[r], name).remote(*a, **kw)
            for r, (a, kw) in zip(self._ranks, per_rank, strict=True)
        ]
        return GroupFuture(self, self._ranks, refs, name)

    def _check_usable(self) -> None:
        if self._state.failed:
            raise WorkerError(
                f"group {self.name!r} was torn down after a failure ({self._state.failed}): "
                f"launch it again"
            )
        if self._state.closed:
            raise WorkerError(f"group {self.name!r} was shut down: launch it again")

    # -------------------------------------------------------------- runtime calls
    @property
    def cluster(self) -> Any:
        """The :class:`~rltrain.scheduler.cluster.Cluster` the group was launched on."""
        return self._state.cluster

    def same_group(self, other: WorkerGroup[Any]) -> bool:
        """Whether ``other`` is this group or a view of it."""
        return other._state is self._state

    def host_call(self, method: str, *args: Any, ranks: Sequence[int] | None = None, **kw: Any):
        """Call a runtime method of the worker host (``_rltrain_*``, not the worker class's).

        Args:
            method: the host method's name.
            *args: its arguments.
            ranks: the ranks to call (all of this view by default).
            **kw: its keyword arguments.

        Returns:
            A :class:`GroupFuture` of the calls.
        """
        ranks = self._ranks if ranks is None else tuple(ranks)
        self._check_usable()
        refs = [getattr(self._state.actors[r], method).remote(*args, **kw) for r in ranks]
        return GroupFuture(self, ranks, refs, method)

    def set_num_threads(self, n: int) -> None:
        """Set torch / OpenMP threads in every rank of this view (e.g. at a stage change)."""
        self.host_call("_rltrain_set_num_threads", n).wait()

    def init_process_group(self, backend: str | None = None, timeout_s: float | None = None):
        """Make a torch.distributed default process group over the whole group.

        Rank 0 opens the rendezvous store on a port it picks itself. Backend ``gloo`` on CPU and
        simulated devices, ``nccl`` on GPUs (None chooses). Timeout:
        ``cluster.collective_timeout_s``.
        """
        from rltrain.scheduler.collective import init_group_process_group

        init_group_process_group(self, backend, timeout_s)

    def collect_spans(self) -> list[Span]:
        """Drain the trace spans every rank recorded."""
        return [s for spans in self.host_call("_rltrain_drain_spans").wait() for s in spans]

    # ------------------------------------------------------------ failure / close
    def _fail(self, rank: int, method: str, exc: BaseException) -> WorkerError:
        info = self._state.infos[rank] if rank < len(self._state.infos) else None
        who = info.describe() if info else f"group {self.name!r} rank {rank}"
        failure = read_failure(exc)
        what, where, worker = self._blame(rank, method, failure, info)
        said = f": {one_line(failure.cause)}" if failure.cause is not None else ""
        message = f"{who}: {what}{said}:\n{exc}"
        if failure.kind == "died" and worker is not None:
            message += "\n" + self._node_neighbours(worker)
        self._state.failed = f"rank {rank} {method!r}"
        self._state.cluster.on_group_failure(self.name)
        err = WorkerError(
            message + "\nThe group and the groups sharing a collective with it were torn down."
        )
        err.worker = worker  # type: ignore[attr-defined]
        err.cause = failure.cause  # type: ignore[attr-defined]
        err.where = where  # type: ignore[attr-defined]
        return err

    def _blame(
        self, rank: int, method: str, failure: RemoteFailure, info: WorkerInfo | None
    ) -> tuple[str, str, WorkerInfo | None]:
        """What happened, where (``group 'g' rank r 'method'``) and the worker that failed."""
        where = f"group {self.name!r} rank {rank} {method!r}"
        if failure.kind == "died":
            dead = self._find_worker(failure.actor_id)
            if dead is None or dead == info:
                return f"the worker process died while running {method!r}", where, info
            # The worker that died is the one to blame, not the one its result was passed to.
            return (
                f"{method!r} could not run: the worker process of its input, {dead.describe()}, "
                f"died",
                f"group {dead.group!r} rank {dead.rank} (an input of {where})",
                dead,
            )
        if failure.kind == "init":
            never = f" (so {method!r} never ran)" if method != "__init__" else ""
            return (
                f"its __init__ raised{never}",
                f"group {self.name!r} rank {rank} '__init__'",
                info,
            )
        if failure.kind != "input":
            return f"{method!r} raised", where, info
        # The worker that raised is the one to blame, not the one its result was passed to.
        found = self._find_worker(failure.actor_id)
        task_method = failure.task.rsplit(".", 1)[-1]
        if found is not None:
            origin = f"{found.describe()} {task_method!r}"
            origin_where = f"group {found.group!r} rank {found.rank} {task_method!r}"
        else:
            origin = origin_where = f"ray::{failure.task} (pid {failure.pid}, {failure.ip})"
        what = f"{method!r} could not run: its input from {origin} failed"
        return what, f"{origin_where} (an input of {where})", found or info

    def _find_worker(self, actor_id: str) -> WorkerInfo | None:
        """The identity of this job's worker whose Ray actor id (hex) is ``actor_id``."""
        for group in self._state.cluster.groups:
            for actor, info in zip(group.actors, group.workers, strict=False):
                if actor_id and actor._actor_id.hex() == actor_id:
                    return info
        return None

    def _node_neighbours(self, info: WorkerInfo) -> str:
        """The job's processes on the dead worker's node: what a lost node takes with it."""
        on_node = [
            f"{g.name} rank {i.rank}"
            for g in self._state.cluster.groups
            for i in g.workers
            if i.node_id == info.node_id
        ]
        return (
            f"This job's processes on node {info.node_rank} ({info.ip}, id {info.node_id[:12]}): "
            f"{', '.join(on_node) or 'none other'}. If the node left the cluster, all of them "
            f"are gone: trainer.max_restarts restarts the job from its latest checkpoint when its "
            f"plan fits the devices that remain."
        )

    def terminate(self, reason: str) -> None:
        """Mark the group failed with ``reason`` (unless it already is) and kill its actors."""
        self._state.failed = self._state.failed or reason
        self._kill()

    def _kill(self) -> None:
        for actor in self._state.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead or Ray gone
                pass

    def shutdown(self) -> None:
        """Kill every actor of the group; release its reservation if it made its own."""
        if self._state.closed:
            return
        self._state.closed = True
        self._kill()
        if self._state.owns_reservation:
            self._state.reservation.remove()
        self._state.cluster.forget_group(self)

    @property
    def alive(self) -> bool:
        return not (self._state.closed or self._state.failed)

    def __repr__(self) -> str:
        return (
            f"WorkerGroup({self.name!r}, {self._state.cls.__name__}, world_size="
            f"{self.world_size}, ranks={self._ranks})"
        )


class WorkerGroupBuilder(Generic[W]):
    """``MyWorker.create_group(*args, **kwargs)``: the class and its constructor arguments.

    Attributes:
        process_ask: what each process asks Ray for when the group reserves its own
            resources (``launch`` without a reservation); None: an equal part of its bundle.
    """

    process_ask: ProcessAsk | None = None

    def __init__(self, cls: type[W], args: tuple[Any, ...], kwargs: Mapping[str, Any]):
        if not issubclass(cls, Worker):
            raise TypeError(f"{cls.__name__} must subclass rltrain.scheduler.Worker")
        self.cls = cls
        self.args = args
        self.kwargs = dict(kwargs)

    def launch(
        self,
        cluster: Cluster,
        name: str,
        placement_strategy: Any,
        *,
        reservation: Reservation | None = None,
        isolate_accelerator: bool = True,
        num_threads: int | None = None,
        max_concurrency: int = 1,
        timeout_s: float | None = None,
    ) -> WorkerGroup[W]:
        """Start one actor per placement and wait until all are ready.

        Args:
            cluster: the running cluster.
            name: the group's (component's) name; also its name in ``reservation``.
            placement_strategy: anything with ``get_placement(cluster_spec, isolate)`` or a list
                of :class:`Placement`.
            reservation: the job's reservation (``cluster.reserve(...)``); None reserves just
                this group's devices, released with the group.
            isolate_accelerator: passed to the strategy.
            num_threads: torch threads per process (None: from the reservation's CPU shares).
            max_concurrency: calls an actor runs at once (threads); 1 keeps calls in order.
            timeout_s: start-up limit (default ``cluster.startup_timeout_s``).

        Returns:
            The ready group.

        Raises:
            ResourceError: when Ray cannot reserve or start the workers in time.
            WorkerError: when a worker's ``__init__`` raises.
            PlacementError: for a bad strategy or a process outside the reservation.
        """
        timeout_s = cluster.startup_timeout_s if timeout_s is None else timeout_s
        where = f"worker group {name!r}"
        placements = resolve_placements(
            placement_strategy, cluster.spec, isolate_accelerator, where
        )
        owns = reservation is None
        if reservation is None:
            asks = {name: self.process_ask} if self.process_ask is not None else None
            reservation = cluster.reserve({name: placements}, timeout_s=timeout_s, asks=asks)
        state = _State(name, self.cls, cluster, placements, reservation, owns)
        group: WorkerGroup[W] = WorkerGroup(state)
        cluster.register_group(group)
        try:
            self._start(group, num_threads, max_concurrency, timeout_s)
        except BaseException:
            group.shutdown()
            raise
        return group

    def _contexts(self, state: _State, num_threads: int | None) -> list[WorkerContext]:
        spec, res = state.cluster.spec, state.reservation
        master = spec.nodes[state.placements[0].cluster_node_rank].ip
        out = []
        for p in state.placements:
            slot = res.layout.slot(state.name, p.rank)
            visible = res.visible_devices(p)
            own = tuple(res.physical[(p.cluster_node_rank, d)] for d in p.device_ids)
            env = {
                "RANK": str(p.rank),
                "WORLD_SIZE": str(len(state.placements)),
                "LOCAL_RANK": str(p.local_rank),
                "LOCAL_WORLD_SIZE": str(p.local_world_size),
                "NODE_RANK": str(p.cluster_node_rank),
                "MASTER_ADDR": master,
                "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in visible),
                NOSET_CUDA_ENV: "1",
                "RLTRAIN_ACCELERATOR": p.accelerator_type,
                "RLTRAIN_GROUP": state.name,
            }
            out.append(
                WorkerContext(
                    group=state.name,
                    rank=p.rank,
                    world_size=len(state.placements),
                    placement=p,
                    devices=tuple(visible.index(d) for d in own),
                    device_labels=tuple(device_label(p.cluster_node_rank, d) for d in p.device_ids),
                    physical_devices=own,
                    env=env,
                    num_threads=num_threads or slot.num_threads,
                )
            )
        return out

    def _start(
        self, group: WorkerGroup[W], num_threads: int | None, max_concurrency: int, timeout: float
    ) -> None:
        state = group._state
        remote_cls: Any = ray.remote(host_class(self.cls))
        contexts = self._contexts(state, num_threads)
        runtime_env = state.cluster.actor_runtime_env  # the job's, read once per group
        for p, ctx in zip(state.placements, contexts, strict=True):
            slot = state.reservation.layout.slot(state.name, p.rank)
            actor = remote_cls.options(
                num_cpus=slot.cpus,
                num_gpus=0,
                memory=slot.memory_bytes or None,
                scheduling_strategy=state.reservation.strategy(state.name, p.rank),
                max_concurrency=max_concurrency,
                max_restarts=0,
                runtime_env=runtime_env,
            ).remote(ctx, self.args, self.kwargs)
            state.actors.append(actor)
            node = state.cluster.spec.nodes[p.cluster_node_rank]
            state.infos.append(
                WorkerInfo(
                    state.name,
                    p.rank,
                    p.cluster_node_rank,
                    node.ip,
                    node.ray_node_id or "",
                    ctx.device_labels,
                    ctx.physical_devices,
                )
            )
        refs = [a._rltrain_ready.remote() for a in state.actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            late = [i for i, r in enumerate(refs) if r in set(pending)]
            raise ResourceError(
                f"worker group {state.name!r}: ranks {late} did not start within {timeout:g} s "
                f"(cluster.startup_timeout_s); the node may be out of memory or CPUs, or a "
                f"worker __init__ is slow: raise the timeout or check the Ray logs"
            )
        facts: list[Any] = GroupFuture(group, range(len(refs)), refs, "__init__").wait()
        for i, f in enumerate(facts):
            info = state.infos[i]
            state.infos[i] = WorkerInfo(
                info.group,
                info.rank,
                info.node_rank,
                f["ip"],
                f["node_id"],
                info.devices,
                info.physical_devices,
                f["pid"],
            )
        port = state.actors[0]._rltrain_free_port.remote()
        group.host_call("_rltrain_set_env", {"MASTER_PORT": str(ray.get(port))}).wait(
            timeout, "cluster.startup_timeout_s"
        )
