"""Channels: named, bounded FIFOs between worker groups, with per-key sub-queues.

A :class:`Channel` is a small handle (picklable: pass it to workers) over an async Ray actor.
Small items (pickled size up to ``inline_bytes``, 64 KiB by default) travel **by value**: the
producer pickles them and the pickled bytes ride inside the put call and the get reply, so one
hand-off costs one message to the channel and one back, nothing else. Larger items go to the
object store from the producer's process (``ray.put``) and the channel gets a reference wrapped
in a list, so Ray neither copies the item into the channel actor nor resolves it there: the
channel's memory stays flat however large the items (at most ``maxsize x inline_bytes`` per key
by value). ``get`` returns the bytes or the reference and the consumer fetches the item straight
from the object store; ``get_batch(target_weight)`` moves many items in one call and fetches
their references in one ``ray.get``, which amortises per-item cost for small items.

``start_put`` / ``start_get`` send the call and return a :class:`ChannelFuture` at once, so a
worker can put in the background and fetch its next item ahead while it computes, without a
thread: the channel's round trips then leave the caller's critical path.

Each key has its own FIFO of at most ``maxsize`` items: ``put`` blocks while that queue is full
(``put_nowait`` raises :class:`ChannelFullError`), so a fast producer can never run ahead of a slow
consumer by more than ``maxsize`` items. ``close()`` wakes every blocked caller with
:class:`ChannelClosedError`; items already queued can still be taken.

The producing process owns the item (Ray ownership): if it dies before the item is taken, the
consumer's ``get`` fails with Ray's owner-died error.

Blocking forms (``put``, ``get``, ``get_batch``) and async forms (``async_put``, ``async_get``,
``async_get_batch``, for asyncio code in async actors) behave the same.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rltrain.errors import ResourceError, WorkerError

if TYPE_CHECKING:
    from rltrain.scheduler.cluster import Cluster

DEFAULT_KEY = "default"
#: Items whose pickled size is at most this travel by value (below Ray's 100 KiB inline limit
#: for call arguments, so they never touch the object store).
DEFAULT_INLINE_BYTES = 64 * 1024


class ChannelClosedError(WorkerError):
    """The channel was closed while the caller waited (or before it called)."""


class ChannelFullError(ResourceError):
    """``put_nowait`` on a full sub-queue."""


class ChannelEmptyError(ResourceError):
    """``get_nowait`` on an empty sub-queue."""


class ChannelTimeoutError(WorkerError, TimeoutError):
    """A blocking put/get did not complete within its timeout."""


@dataclass(frozen=True)
class ChannelStats:
    """Counters of one channel.

    Attributes:
        sizes: items queued now, by key.
        high_water: the most items ever queued at once, by key.
        puts: items accepted in total.
        gets: items handed out in total.
        pid: the channel actor's process id (for memory checks).
        maxsize: the bound of each key's queue.
        by_value: items accepted by value (pickled bytes) rather than as object references.
    """

    sizes: dict[str, int]
    high_water: dict[str, int]
    puts: int
    gets: int
    pid: int
    maxsize: int
    by_value: int = 0


class _Queue:
    def __init__(self) -> None:
        self.items: deque[tuple[list[Any], float]] = deque()
        self.weight = 0.0
        self.high_water = 0
        self.changed = asyncio.Condition()


class _ChannelActor:
    """The channel's state: per-key deques of wrapped items (pickled bytes, or ``[ref]`` /
    ``[ref, index]`` for an item in the object store, alone or in a batch's shared object),
    guarded by asyncio conditions. It never unpickles an item, so it needs none of the items'
    classes."""

    def __init__(self, name: str, maxsize: int) -> None:
        self.name = name
        self.maxsize = maxsize
        self.queues: dict[str, _Queue] = {}
        self.closed = False
        self.puts = 0
        self.gets = 0
        self.by_value = 0
        # Ray runs an async actor's calls concurrently, so two puts a producer started back to
        # back may arrive in either order: each handle numbers its puts per key and each put
        # waits its turn here: ``turns`` is a producer's lowest unfinished number, ``finished``
        # its numbers above it that are done (queued, or given up without queuing).
        self.turns: dict[str, int] = {}
        self.finished: dict[str, set[int]] = {}

    def _q(self, key: str) -> _Queue:
        if key not in self.queues:
            self.queues[key] = _Queue()
        return self.queues[key]

    def _closed_error(self, op: str) -> str:
        return f"closed: channel {self.name!r} was closed ({op})"

    async def _wait(self, q: _Queue, ready: Any, timeout: float | None, op: str) -> str | None:
        """Wait until ``ready()`` or close; return an error string or None."""
        async with q.changed:
            try:
                await asyncio.wait_for(q.changed.wait_for(lambda: ready() or self.closed), timeout)
            except asyncio.TimeoutError:
                return f"timeout: channel {self.name!r} {op} waited {timeout} s"
        if self.closed and not ready():
            return self._closed_error(op)
        return None

    def _my_turn(self, order: tuple[str, int] | None) -> bool:
        return order is None or self.turns.get(order[0], 0) >= order[1]

    def _full_error(self, key: str) -> str:
        return f"full: channel {self.name!r} key {key!r} holds {self.maxsize} items"

    async def _await_turn(
        self, key: str, order: tuple[str, int] | None, block: bool, timeout: float | None
    ) -> str | None:
        """Wait until the handle's earlier puts to this key are done; an error string or None.

        A non-blocking put waits only while its predecessors are still arriving: once the
        queue is full they are waiting for room, so it fails at once.
        """
        if self._my_turn(order):
            return None
        q = self._q(key)
        if block:
            return await self._wait(q, lambda: self._my_turn(order), timeout, "put")
        async with q.changed:
            await q.changed.wait_for(
                lambda: self._my_turn(order) or len(q.items) >= self.maxsize or self.closed
            )
        if self._my_turn(order):
            return None
        if self.closed:
            return self._closed_error("put")
        return self._full_error(key)

    async def _finish(self, q: _Queue, order: tuple[str, int] | None) -> None:
        """Mark a put done (queued or given up), so the handle's next puts may go."""
        if order is None:
            return
        producer, seq = order
        done = self.finished.setdefault(producer, set())
        done.add(seq)
        turn = self.turns.get(producer, 0)
        while turn in done:
            done.remove(turn)
            turn += 1
        self.turns[producer] = turn
        async with q.changed:
            q.changed.notify_all()

    async def put(
        self,
        wrapped: Any,
        key: str,
        weight: float,
        block: bool,
        timeout: float | None,
        order: tuple[str, int] | None = None,
    ) -> str | None:
        q = self._q(key)
        began = asyncio.get_running_loop().time()
        try:
            err = await self._await_turn(key, order, block, timeout)
            if err:
                return err
            return await self._put(wrapped, key, weight, block, _left(timeout, began))
        finally:
            await self._finish(q, order)

    async def _put(
        self, wrapped: Any, key: str, weight: float, block: bool, timeout: float | None
    ) -> str | None:
        q = self._q(key)
        if self.closed:
            return self._closed_error("put")
        if len(q.items) >= self.maxsize:
            if not block:
                return self._full_error(key)
            err = await self._wait(q, lambda: len(q.items) < self.maxsize, timeout, "put")
            if err:
                return err
            if self.closed:
                return self._closed_error("put")
        q.items.append((wrapped, weight))
        q.weight += weight
        q.high_water = max(q.high_water, len(q.items))
        self.puts += 1
        self.by_value += isinstance(wrapped, bytes)
        async with q.changed:
            q.changed.notify_all()
        return None

    async def put_batch(
        self,
        wrapped: list[Any],
        key: str,
        weight: float,
        timeout: float | None,
        order: tuple[str, int] | None = None,
    ) -> str | None:
        q = self._q(key)
        try:
            err = await self._await_turn(key, order, True, timeout)
            if err:
                return err
            for w in wrapped:
                err = await self._put(w, key, weight, True, timeout)
                if err:
                    return err
            return None
        finally:
            await self._finish(q, order)

    async def get_batch(
        self, key: str, target_weight: float, max_items: int, block: bool, timeout: float | None
    ) -> tuple[str | None, list[Any]]:
        q = self._q(key)
        if not q.items:
            if not block:
                return f"empty: channel {self.name!r} key {key!r} is empty", []
            err = await self._wait(q, lambda: bool(q.items), timeout, "get")
            if err:
                return err, []
        out: list[Any] = []
        got = 0.0
        # Take what is there up to the target; wait for more only while below it.
        while len(out) < max_items and got < target_weight:
            if not q.items:
                err = await self._wait(q, lambda: bool(q.items), timeout, "get_batch")
                if err and not out:
                    return err, []
                if err:
                    break
            wrapped, weight = q.items.popleft()
            q.weight -= weight
            got += weight
            out.append(wrapped)
        self.gets += len(out)
        async with q.changed:
            q.changed.notify_all()
        return None, out

    async def close(self) -> None:
        self.closed = True
        for q in self.queues.values():
            async with q.changed:
                q.changed.notify_all()

    async def stats(self) -> ChannelStats:
        return ChannelStats(
            sizes={k: len(q.items) for k, q in self.queues.items()},
            high_water={k: q.high_water for k, q in self.queues.items()},
            puts=self.puts,
            gets=self.gets,
            pid=os.getpid(),
            maxsize=self.maxsize,
            by_value=self.by_value,
        )


def _left(timeout: float | None, began: float) -> float | None:
    """What is left of ``timeout`` seconds counted from loop time ``began`` (None: no limit)."""
    if timeout is None:
        return None
    return max(0.0, timeout - (asyncio.get_running_loop().time() - began))


_ERRORS = {
    "closed": ChannelClosedError,
    "timeout": ChannelTimeoutError,
    "full": ChannelFullError,
    "empty": ChannelEmptyError,
}


def _raise(err: str | None) -> None:
    if err:
        kind, _, text = err.partition(": ")
        raise _ERRORS[kind](text)


def _too_big(item: Any, limit: int) -> bool:
    """A cheap look at the common large items, so they are not pickled only to be put."""
    nbytes = getattr(item, "nbytes", None)  # numpy arrays, torch tensors
    if isinstance(nbytes, int):
        return nbytes > limit
    if isinstance(item, bytes | bytearray | memoryview):
        return len(item) > limit
    return False


def _wrap(item: Any, limit: int) -> Any:
    """Pickled bytes when the item pickles into at most ``limit`` bytes, else ``[ref]``."""
    small = _wrap_small(item, limit)
    return small if small is not None else [ray.put(item)]


def _wrap_small(item: Any, limit: int) -> bytes | None:
    """The pickled item when it pickles into at most ``limit`` bytes, else None.

    Items holding object references or actor handles are never pickled here: only Ray's own
    serializer keeps their reference counts right, so they go through ``ray.put``.
    """
    if limit <= 0 or _too_big(item, limit):
        return None
    import io

    out = io.BytesIO()
    pickler = _pickler_class()(out, limit)
    pickler.dump(item)
    if pickler.refs or pickler.size > limit or out.tell() > limit:
        return None
    return out.getvalue()


_PICKLER: list[type] = []


def _pickler_class() -> type:
    """Ray's cloudpickle pickler (so items pickle exactly as ``ray.put`` would pickle them),
    noting object references and sizing array buffers; built on first use."""
    if not _PICKLER:
        from ray import cloudpickle

        class _Pickler(cloudpickle.Pickler):
            def __init__(self, file: Any, limit: int) -> None:
                super().__init__(file, protocol=5, buffer_callback=self._in_band)
                self.limit, self.size, self.refs = limit, 0, False

            def _in_band(self, buf: pickle.PickleBuffer) -> bool:
                # Array buffers stay in the stream while the total is small; past the limit they
                # go out of band (not copied) and the caller drops the stream.
                self.size += buf.raw().nbytes
                return self.size <= self.limit

            def persistent_id(self, obj: Any) -> None:
                # A plainly pickled reference loses its owner: leave such items to Ray.
                if isinstance(obj, ray.ObjectRef | ray.actor.ActorHandle):
                    self.refs = True
                return None

        _PICKLER.append(_Pickler)
    return _PICKLER[0]


def _wrap_batch(items: list[Any], limit: int) -> list[Any]:
    """Wrap a batch: small items by value, the large ones together in **one** object-store
    object, each queued as ``[ref, index]``; one object and one reference per batch instead of
    one per item is what makes batches of MB-sized items cheap. The object lives until the last
    of its items is taken."""
    wrapped: list[Any] = [_wrap_small(item, limit) for item in items]
    large = [i for i, w in enumerate(wrapped) if w is None]
    if len(large) == 1:
        wrapped[large[0]] = [ray.put(items[large[0]])]
    elif large:
        ref = ray.put(tuple(items[i] for i in large))
        for n, i in enumerate(large):
            wrapped[i] = [ref, n]
    return wrapped


def _unwrap(wrapped: list[Any]) -> list[Any]:
    """The items of a get: by-value ones unpickled, references fetched in one ``ray.get``."""
    refs = list({w[0]: None for w in wrapped if not isinstance(w, bytes)})
    return _place(wrapped, dict(zip(refs, ray.get(refs), strict=True)) if refs else {})


def _place(wrapped: list[Any], fetched: dict[Any, Any]) -> list[Any]:
    out = []
    for w in wrapped:
        if isinstance(w, bytes):
            out.append(pickle.loads(w))
        else:
            value = fetched[w[0]]
            out.append(value[w[1]] if len(w) > 1 else value)
    return out


class ChannelFuture:
    """A put or get sent to the channel and not yet waited for (see :meth:`Channel.start_put`).

    Args:
        channel: the channel's name (for errors).
        ref: the reference of the channel actor's reply.
        kind: ``"put"`` or ``"get"``.
    """

    def __init__(self, channel: str, ref: Any, kind: str) -> None:
        self.channel, self.ref, self.kind = channel, ref, kind

    def done(self) -> bool:
        """Whether the channel has answered (``result`` will not block)."""
        ready, _ = ray.wait([self.ref], timeout=0)
        return bool(ready)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the answer: None for a put, the item for a get.

        Args:
            timeout: seconds to wait here (the channel's own timeout was given at the start).

        Raises:
            ChannelClosedError: the channel is or got closed (or its actor is gone).
            ChannelTimeoutError: the channel or this wait timed out.
        """
        try:
            out = ray.get(self.ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise ChannelTimeoutError(
                f"channel {self.channel!r} {self.kind} not answered within {timeout} s"
            ) from None
        except ray.exceptions.RayActorError:
            raise ChannelClosedError(
                f"channel {self.channel!r} is gone (its actor died or the job was shut down)"
            ) from None
        if self.kind == "put":
            _raise(out)
            return None
        err, wrapped = out
        _raise(err)
        return _unwrap(wrapped)[0]


class Channel:
    """A handle on a named bounded channel; picklable, so workers can put and get too."""

    def __init__(
        self, name: str, maxsize: int, actor: Any, inline_bytes: int = DEFAULT_INLINE_BYTES
    ) -> None:
        self.name = name
        self.maxsize = maxsize
        self.inline_bytes = inline_bytes
        self._actor = actor
        self._producer: str | None = None  # this copy's id in the channel's put order
        self._seqs: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Each process's copy numbers its own puts: the id and counter do not travel.
        state = dict(self.__dict__)
        state["_producer"], state["_seqs"] = None, {}
        return state

    def _order(self, key: str) -> tuple[str, int]:
        """This handle's next number for a put to ``key`` (keys are ordered independently, so a
        put waiting for room under one key never holds up another key)."""
        if self._producer is None:
            self._producer = uuid.uuid4().hex
        seq = self._seqs.setdefault(key, itertools.count())
        return f"{self._producer}/{key}", next(seq)

    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int,
        cluster: Cluster | None = None,
        inline_bytes: int = DEFAULT_INLINE_BYTES,
    ) -> Channel:
        """Start the channel actor.

        Args:
            name: the channel's name (unique in the Ray namespace; ``connect`` finds it by it).
            maxsize: items each key's queue holds at most (> 0).
            cluster: when given, the channel is removed with the cluster's other resources.
            inline_bytes: items pickling into at most this many bytes travel by value; larger
                ones through the object store (0: every item through the object store).

        Raises:
            ResourceError: for ``maxsize < 1`` or a negative ``inline_bytes``.
        """
        if maxsize < 1:
            raise ResourceError(
                f"channel {name!r}: maxsize={maxsize} must be >= 1 (channels are bounded)"
            )
        if inline_bytes < 0:
            raise ResourceError(
                f"channel {name!r}: inline_bytes={inline_bytes} must be >= 0 (0 sends every "
                f"item through the object store)"
            )
        try:
            actor = (
                ray.remote(_ChannelActor)
                .options(name=f"rltrain.channel.{name}", num_cpus=0, max_concurrency=1000)
                .remote(name, maxsize)
            )
        except ValueError:  # Ray refuses a second actor of the same name
            raise ResourceError(
                f"a channel named {name!r} already exists: use Channel.connect({name!r}) or "
                f"another name"
            ) from None
        channel = cls(name, maxsize, actor, inline_bytes)
        if cluster is not None:
            cluster.register_channel(channel)
        return channel

    @classmethod
    def connect(cls, name: str, inline_bytes: int = DEFAULT_INLINE_BYTES) -> Channel:
        """A handle on an existing channel, by name.

        Raises:
            ResourceError: when no channel of that name exists.
        """
        try:
            actor = ray.get_actor(f"rltrain.channel.{name}")
        except ValueError:
            raise ResourceError(
                f"no channel named {name!r}: create it with Channel.create first"
            ) from None
        stats: Any = ray.get(actor.stats.remote())
        return cls(name, stats.maxsize, actor, inline_bytes)

    # ------------------------------------------------------------------ non-blocking
    def start_put(
        self, item: Any, key: str = DEFAULT_KEY, weight: float = 1.0, timeout: float | None = None
    ) -> ChannelFuture:
        """Send ``item`` to the channel and return at once.

        Puts started through one handle to one key are queued in the order they were started,
        though the channel actor runs its calls concurrently (each handle numbers its puts per
        key; a copy of the handle in another process numbers its own).

        Args:
            item: any picklable object (by value when it pickles into ``inline_bytes``).
            key: the sub-queue.
            weight: the item's weight for ``get_batch``.
            timeout: seconds the channel waits for room before failing the put.

        Returns:
            A future whose ``result()`` returns None once the queue accepted the item, or raises
            :class:`ChannelClosedError` / :class:`ChannelTimeoutError`.
        """
        wrapped = _wrap(item, self.inline_bytes)
        ref = self._actor.put.remote(wrapped, key, weight, True, timeout, self._order(key))
        return ChannelFuture(self.name, ref, "put")

    def start_get(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> ChannelFuture:
        """Ask for the oldest item of ``key`` and return at once.

        Args:
            key: the sub-queue.
            timeout: seconds the channel waits for an item before failing the get.

        Returns:
            A future whose ``result()`` returns the item, or raises
            :class:`ChannelClosedError` / :class:`ChannelTimeoutError`.
        """
        ref = self._actor.get_batch.remote(key, 0.5, 1, True, timeout)
        return ChannelFuture(self.name, ref, "get")

    # ------------------------------------------------------------------ blocking
    def put(
        self, item: Any, key: str = DEFAULT_KEY, weight: float = 1.0, timeout: float | None = None
    ) -> None:
        """Queue ``item``; block while the key's queue is full.

        Raises:
            ChannelClosedError: the channel is or gets closed.
            ChannelTimeoutError: still full after ``timeout`` seconds.
        """
        self.start_put(item, key, weight, timeout).result()

    def put_nowait(self, item: Any, key: str = DEFAULT_KEY, weight: float = 1.0) -> None:
        """Queue ``item`` or raise :class:`ChannelFullError` at once."""
        wrapped, order = _wrap(item, self.inline_bytes), self._order(key)
        _raise(self._call(self._actor.put.remote(wrapped, key, weight, False, None, order)))

    def put_batch(
        self,
        items: list[Any],
        key: str = DEFAULT_KEY,
        weight: float = 1.0,
        timeout: float | None = None,
    ) -> None:
        """Queue several items (each of ``weight``) in one call; blocks as :meth:`put` per item.

        Items too large to go by value share one object-store object (the batch's large items
        are stored together and each is queued as a reference to its place in it), so a batch
        costs one ``ray.put``; that object is freed once every one of its items was taken.

        Raises:
            ChannelClosedError: the channel is or gets closed (earlier items stay queued).
            ChannelTimeoutError: an item still found the queue full after ``timeout`` seconds.
        """
        wrapped = _wrap_batch(list(items), self.inline_bytes)
        order = self._order(key)
        _raise(self._call(self._actor.put_batch.remote(wrapped, key, weight, timeout, order)))

    def get(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> Any:
        """Take the oldest item of ``key``; block while it is empty.

        Raises:
            ChannelClosedError: the channel is closed and the key's queue is empty.
            ChannelTimeoutError: still empty after ``timeout`` seconds.
        """
        return self.start_get(key, timeout).result()

    def get_nowait(self, key: str = DEFAULT_KEY) -> Any:
        """Take the oldest item or raise :class:`ChannelEmptyError` at once."""
        return self._fetch(self._actor.get_batch.remote(key, 0.5, 1, False, None))[0]

    def get_batch(
        self,
        target_weight: float,
        key: str = DEFAULT_KEY,
        timeout: float | None = None,
        max_items: int = 1_000_000,
    ) -> list[Any]:
        """Take items until their weights add up to ``target_weight`` (or ``max_items``).

        Blocks for the first item and while the batch is below the target; after a timeout or
        close it returns what it has (raising only when it has nothing).
        """
        return self._fetch(
            self._actor.get_batch.remote(key, target_weight, max_items, True, timeout)
        )

    # --------------------------------------------------------------------- async
    async def async_put(
        self, item: Any, key: str = DEFAULT_KEY, weight: float = 1.0, timeout: float | None = None
    ) -> None:
        """Async :meth:`put`."""
        wrapped = _wrap(item, self.inline_bytes)
        _raise(await self._actor.put.remote(wrapped, key, weight, True, timeout, self._order(key)))

    async def async_get(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> Any:
        """Async :meth:`get`."""
        return (await self._async_take(key, 0.5, 1, timeout))[0]

    async def async_get_batch(
        self, target_weight: float, key: str = DEFAULT_KEY, timeout: float | None = None
    ) -> list[Any]:
        """Async :meth:`get_batch`."""
        return await self._async_take(key, target_weight, 1_000_000, timeout)

    async def _async_take(
        self, key: str, target: float, max_items: int, timeout: float | None
    ) -> list[Any]:
        err, wrapped = await self._actor.get_batch.remote(key, target, max_items, True, timeout)
        _raise(err)
        refs = list({w[0]: None for w in wrapped if not isinstance(w, bytes)})
        return _place(wrapped, dict(zip(refs, await asyncio.gather(*refs), strict=True)))

    # --------------------------------------------------------------------- misc
    def stats(self) -> ChannelStats:
        """Queue sizes, high-water marks and counters."""
        return self._call(self._actor.stats.remote())

    def qsize(self, key: str = DEFAULT_KEY) -> int:
        """Items queued under ``key`` now."""
        return self.stats().sizes.get(key, 0)

    def close(self) -> None:
        """Close: blocked and later puts and empty gets raise :class:`ChannelClosedError`."""
        self._call(self._actor.close.remote())

    def terminate(self) -> None:
        """Kill the channel's actor at once (job teardown); items in it are lost."""
        try:
            ray.kill(self._actor)
        except Exception:  # already gone
            pass

    def _call(self, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError:
            raise ChannelClosedError(
                f"channel {self.name!r} is gone (its actor died or the job was shut down)"
            ) from None

    def _fetch(self, ref: Any) -> list[Any]:
        err, wrapped = self._call(ref)
        _raise(err)
        return _unwrap(wrapped)

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, maxsize={self.maxsize})"
