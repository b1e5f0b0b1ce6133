"""Channels: named, bounded FIFOs between worker groups, with per-key sub-queues.

A :class:`Channel` is a small handle (picklable: pass it to workers) over an async Ray actor that
holds only object references. ``put`` stores the item in the object store from the producer's
process (``ray.put``) and hands the channel a reference wrapped in a list, so Ray neither copies
the item into the channel actor nor resolves it there: the channel's memory stays flat however
large the items. ``get`` returns the reference and the consumer fetches the item straight from
the object store; ``get_batch(target_weight)`` moves many references in one call and fetches them
in one ``ray.get``, which amortises per-item cost for small items.

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
import os
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rltrain.errors import ResourceError, WorkerError

if TYPE_CHECKING:
    from rltrain.scheduler.cluster import Cluster

DEFAULT_KEY = "default"


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
    """

    sizes: dict[str, int]
    high_water: dict[str, int]
    puts: int
    gets: int
    pid: int
    maxsize: int


class _Queue:
    def __init__(self) -> None:
        self.items: deque[tuple[list[Any], float]] = deque()
        self.weight = 0.0
        self.high_water = 0
        self.changed = asyncio.Condition()


class _ChannelActor:
    """The channel's state: per-key deques of wrapped refs, guarded by asyncio conditions."""

    def __init__(self, name: str, maxsize: int) -> None:
        self.name = name
        self.maxsize = maxsize
        self.queues: dict[str, _Queue] = {}
        self.closed = False
        self.puts = 0
        self.gets = 0

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

    async def put(
        self, wrapped: list[Any], key: str, weight: float, block: bool, timeout: float | None
    ) -> str | None:
        q = self._q(key)
        if self.closed:
            return self._closed_error("put")
        if len(q.items) >= self.maxsize:
            if not block:
                return f"full: channel {self.name!r} key {key!r} holds {self.maxsize} items"
            err = await self._wait(q, lambda: len(q.items) < self.maxsize, timeout, "put")
            if err:
                return err
            if self.closed:
                return self._closed_error("put")
        q.items.append((wrapped, weight))
        q.weight += weight
        q.high_water = max(q.high_water, len(q.items))
        self.puts += 1
        async with q.changed:
            q.changed.notify_all()
        return None

    async def put_batch(
        self, wrapped: list[list[Any]], key: str, weight: float, timeout: float | None
    ) -> str | None:
        for w in wrapped:
            err = await self.put(w, key, weight, True, timeout)
            if err:
                return err
        return None

    async def get_batch(
        self, key: str, target_weight: float, max_items: int, block: bool, timeout: float | None
    ) -> tuple[str | None, list[list[Any]]]:
        q = self._q(key)
        if not q.items:
            if not block:
                return f"empty: channel {self.name!r} key {key!r} is empty", []
            err = await self._wait(q, lambda: bool(q.items), timeout, "get")
            if err:
                return err, []
        out, got = [], 0.0
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
        )


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


class Channel:
    """A handle on a named bounded channel; picklable, so workers can put and get too."""

    def __init__(self, name: str, maxsize: int, actor: Any) -> None:
        self.name = name
        self.maxsize = maxsize
        self._actor = actor

    @classmethod
    def create(cls, name: str, maxsize: int, cluster: Cluster | None = None) -> Channel:
        """Start the channel actor.

        Args:
            name: the channel's name (unique in the Ray namespace; ``connect`` finds it by it).
            maxsize: items each key's queue holds at most (> 0).
            cluster: when given, the channel is removed with the cluster's other resources.

        Raises:
            ResourceError: for ``maxsize < 1``.
        """
        if maxsize < 1:
            raise ResourceError(
                f"channel {name!r}: maxsize={maxsize} must be >= 1 (channels are bounded)"
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
        channel = cls(name, maxsize, actor)
        if cluster is not None:
            cluster._track_channel(channel)
        return channel

    @classmethod
    def connect(cls, name: str) -> Channel:
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
        return cls(name, ray.get(actor.stats.remote()).maxsize, actor)

    # ------------------------------------------------------------------ blocking
    def put(
        self, item: Any, key: str = DEFAULT_KEY, weight: float = 1.0, timeout: float | None = None
    ) -> None:
        """Queue ``item``; block while the key's queue is full.

        Raises:
            ChannelClosedError: the channel is or gets closed.
            ChannelTimeoutError: still full after ``timeout`` seconds.
        """
        _raise(self._call(self._actor.put.remote([ray.put(item)], key, weight, True, timeout)))

    def put_nowait(self, item: Any, key: str = DEFAULT_KEY, weight: float = 1.0) -> None:
        """Queue ``item`` or raise :class:`ChannelFullError` at once."""
        _raise(self._call(self._actor.put.remote([ray.put(item)], key, weight, False, None)))

    def put_batch(
        self,
        items: list[Any],
        key: str = DEFAULT_KEY,
        weight: float = 1.0,
        timeout: float | None = None,
    ) -> None:
        """Queue several items (each of ``weight``) in one call; blocks as :meth:`put` per item.

        Raises:
            ChannelClosedError: the channel is or gets closed (earlier items stay queued).
            ChannelTimeoutError: an item still found the queue full after ``timeout`` seconds.
        """
        wrapped = [[ray.put(item)] for item in items]
        _raise(self._call(self._actor.put_batch.remote(wrapped, key, weight, timeout)))

    def get(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> Any:
        """Take the oldest item of ``key``; block while it is empty.

        Raises:
            ChannelClosedError: the channel is closed and the key's queue is empty.
            ChannelTimeoutError: still empty after ``timeout`` seconds.
        """
        return self._fetch(self._actor.get_batch.remote(key, 0.5, 1, True, timeout))[0]

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
        _raise(await self._actor.put.remote([ray.put(item)], key, weight, True, timeout))

    async def async_get(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> Any:
        """Async :meth:`get`."""
        err, wrapped = await self._actor.get_batch.remote(key, 0.5, 1, True, timeout)
        _raise(err)
        return await wrapped[0][0]

    async def async_get_batch(
        self, target_weight: float, key: str = DEFAULT_KEY, timeout: float | None = None
    ) -> list[Any]:
        """Async :meth:`get_batch`."""
        err, wrapped = await self._actor.get_batch.remote(
            key, target_weight, 1_000_000, True, timeout
        )
        _raise(err)
        return list(await asyncio.gather(*(w[0] for w in wrapped)))

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

    def _kill(self) -> None:
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
        return ray.get([w[0] for w in wrapped])

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, maxsize={self.maxsize})"
