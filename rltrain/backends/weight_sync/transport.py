"""The runtime side of weight sync: one interface for the actor's export and a receiver's load.

The transport is decided from the plan (:func:`~rltrain.placement.transport_choice.
choose_transport`); this module moves the bytes:

- :class:`WeightSender` lives in an actor rank that feeds receivers. ``export(named, version)``
  returns what the driver hands the receivers: :class:`~.host.HostBuckets` (``host``), an
  :class:`~.ipc.IpcPayload` (``ipc``) or a :class:`CollectiveVersion` marker (``collective``:
  the bytes go by broadcast, so only the version number travels through the driver).
- A receiver loads what it was handed through a ``loader(bucket, flat) -> tensors written`` of
  its engine (a torch model copies by name; vLLM slices per TP shard), or, for ``collective``,
  receives every version the sender broadcast up to the one it was handed
  (:func:`receive_versions`); under ``ipc`` it then acknowledges the load
  (:func:`acknowledge_ipc`), so the sender frees its device buckets.

The collective sender snapshots the weights into its own buckets (so training may go on) and
broadcasts them from a background thread, in version order: an asynchronous run's rollout takes a
version when its next generation starts, without the actor waiting for it. A version's broadcast
starts when every receiver announces it takes it (through the group's store), so
``cluster.collective_timeout_s`` bounds the transfer, however many generations
(``trainer.max_staleness``) the version waits; one snapshot at a time sits on the group's device,
later ones wait on the host.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from rltrain.backends.weight_sync.buckets import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    pack_bucket,
    plan_buckets,
)
from rltrain.backends.weight_sync.collective import SyncGroup
from rltrain.backends.weight_sync.host import HostBuckets, pack_to_host
from rltrain.errors import ConfigError, WorkerError
from rltrain.placement.transport_choice import TransportChoice

#: ``loader(bucket, flat) -> tensors written``: how a receiver writes one bucket into its model.
Loader = Callable[[Bucket, torch.Tensor], int]


@dataclass(frozen=True)
class CollectiveVersion:
    """What a receiver is handed under the ``collective`` transport: the version to reach.

    The bytes arrive by broadcast from the receiver's source actor rank; the receiver takes
    every version broadcast after the one it holds, up to this one.
    """

    version: int


@dataclass
class _Snapshot:
    """One exported version waiting for (or in) its broadcast: buckets on the group's device
    (``on_device``) or on the host, moved to the device one bucket at a time when sent."""

    version: int
    layout: tuple[Bucket, ...]
    flats: list[torch.Tensor]
    device: torch.device
    on_device: bool
    done: Future[int]


class CollectiveSender:
    """Broadcasts weight versions to one sync group from a background thread, in order.

    A version's broadcast starts only once every receiver announced that it takes it
    (:meth:`SyncGroup.want`, when its next generation starts), so ``timeout_s`` of the group
    bounds the transfer, not how long a receiver keeps the version waiting. At most one snapshot
    sits on the group's device: the first one pending; a version exported while another is
    pending is packed on the host and its buckets go to the device one at a time as they are
    broadcast.

    Args:
        group: the sync group; this process is its rank 0.
        bucket_bytes: the largest bucket.
    """

    def __init__(self, group: SyncGroup, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.group = group
        self.bucket_bytes = bucket_bytes
        self._layout: tuple[Bucket, ...] | None = None
        self._sent: deque[_Snapshot] = deque()  # pending, oldest first
        self._queue: queue.SimpleQueue[_Snapshot | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._device_bytes = 0
        self._bytes_lock = threading.Lock()
        # A daemon thread, not an executor: a process that exits while a version still waits
        # for its receivers must not block on joining it.
        self._thread = threading.Thread(target=self._run, name="weight-sync", daemon=True)
        self._thread.start()

    @property
    def device_bytes(self) -> int:
        """Bytes this sender holds on the group's device now (the snapshot in flight, or the
        bucket being moved to the device); 0 when the group's device is the host (gloo)."""
        return self._device_bytes if self.group.device.type != "cpu" else 0

    def send(self, named: Sequence[tuple[str, torch.Tensor]], version: int) -> int:
        """Snapshot ``named`` into buckets now and queue their broadcast.

        The snapshot goes on the group's device when no other version is pending, else on the
        host.

        Returns:
            Bytes queued.

        Raises:
            WorkerError: an earlier broadcast failed, or the sender was closed.
        """
        if self._stop.is_set():
            raise WorkerError("weight sync: the collective sender was closed; nothing is sent")
        items = dict(named)
        if self._layout is None:
            self._layout = plan_buckets(list(items.items()), self.bucket_bytes)
        self._reap()
        on_device = not self._sent
        where = self.group.device if on_device else torch.device("cpu")
        if on_device:
            self._add_device_bytes(sum(b.nbytes for b in self._layout))
        flats = [
            pack_bucket(b, items, out=torch.empty(b.nbytes, dtype=torch.uint8, device=where))
            for b in self._layout
        ]
        _synchronize([where, *(t.device for t in items.values())])
        snap = _Snapshot(version, self._layout, flats, where, on_device, Future())
        self._sent.append(snap)
        self._queue.put(snap)
        return sum(b.nbytes for b in self._layout)

    def _add_device_bytes(self, nbytes: int) -> None:
        with self._bytes_lock:
            self._device_bytes += nbytes

    def _run(self) -> None:
        """The background thread: broadcast each snapshot once its receivers want it."""
        while (snap := self._queue.get()) is not None:
            if not snap.done.set_running_or_notify_cancel():
                self._release(snap)
                continue
            try:
                if not self.group.wait_wanted(snap.version - 1, self._stop):
                    raise WorkerError(
                        f"weight sync: version {snap.version} was not broadcast: the sender "
                        f"was closed first"
                    )
                sent = self._broadcast(snap)
            except BaseException as exc:  # handed to the export or flush that reaps it
                self._release(snap)
                snap.done.set_exception(exc)
            else:
                # Released before it reads as done: the next export may then pack on the device.
                self._release(snap)
                snap.done.set_result(sent)

    def _release(self, snap: _Snapshot) -> None:
        """Drop a snapshot's buckets (every receiver has them, or none will)."""
        snap.flats.clear()
        if snap.on_device:
            self._add_device_bytes(-sum(b.nbytes for b in snap.layout))

    def _broadcast(self, snap: _Snapshot) -> int:
        device = self.group.device
        self.group.broadcast_object((snap.version, snap.layout), 0)
        for i, flat in enumerate(snap.flats):
            if snap.on_device:
                self.group.broadcast(flat, 0)
                continue
            snap.flats[i] = _EMPTY  # the host bucket goes once it is on the device
            self._add_device_bytes(snap.layout[i].nbytes)
            try:
                moved = flat.to(device)
                del flat
                self.group.broadcast(moved, 0)
                _synchronize([device])  # the bucket's device memory is free once undeclared
                del moved
            finally:
                self._add_device_bytes(-snap.layout[i].nbytes)
        _synchronize([device])
        return sum(b.nbytes for b in snap.layout)

    def _reap(self) -> None:
        while self._sent and self._sent[0].done.done():
            self._sent.popleft().done.result()  # re-raises a failed broadcast

    @property
    def pending(self) -> int:
        """Versions queued or being broadcast."""
        self._reap()
        return len(self._sent)

    @property
    def held(self) -> list[tuple[int, torch.device]]:
        """Each version queued or being broadcast, oldest first, with the device its snapshot
        was packed on (the group's device for the first, the host for later ones)."""
        return [(s.version, s.device) for s in self._sent if not s.done.done()]

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued version was broadcast; each broadcast starts once every
        receiver takes its version, so a version no receiver is told to take keeps this
        waiting (the run's end first has the receivers take the last version).

        Raises:
            WorkerError: a broadcast failed, or one did not finish in ``timeout`` seconds.
        """
        while self._sent:
            fut = self._sent[0].done
            try:
                fut.result(timeout=timeout)
            except TimeoutError:
                raise WorkerError(
                    f"weight sync: a broadcast did not finish within {timeout} s "
                    f"(cluster.collective_timeout_s): the receivers asked for version "
                    f"{self.group.wanted()} at most; each must take every version it was "
                    f"handed before the actor's sender is flushed"
                ) from None
            finally:
                if fut.done():
                    self._sent.popleft()  # a failed broadcast is raised once

    def close(self) -> None:
        """Stop the background thread; versions not yet broadcast are dropped (their exports
        fail if reaped). Safe to call more than once."""
        self._stop.set()
        self._queue.put(None)


#: What a host bucket's slot holds once the bucket went to the device.
_EMPTY = torch.empty(0, dtype=torch.uint8)


def _synchronize(devices: Sequence[torch.device]) -> None:
    """Wait for the current CUDA stream of each CUDA device among ``devices`` (copies into or
    out of a snapshot, a broadcast's use of a bucket); nothing off CUDA."""
    for device in {d for d in devices if d.type == "cuda"}:
        torch.cuda.current_stream(device).synchronize()


def receive_versions(group: SyncGroup, loader: Loader, current: int, target: int) -> int:
    """Take every version the source broadcasts after ``current``, up to ``target``.

    Args:
        group: the sync group (this process is a receiver).
        loader: writes one bucket into this process's model.
        current: the version this process holds.
        target: the version to reach.

    Returns:
        The version held afterwards (``target``).

    Raises:
        WorkerError: the source sent a version past ``target`` (the two sides lost step), or
            a peer receiver did not ask for the next version within the group's timeout.
    """
    if current >= target:
        return current
    # Announced before joining any broadcast: the source starts a version only once every
    # receiver wants it, and the group's receivers (which hold the same versions) wait for
    # each other, so no rank sits in a broadcast, on its timeout, while another generates.
    group.want(target)
    while current < target:
        # the peers start the same call: one that never announces (a call Ray cancelled
        # before it began) fails this one after the collective timeout, as a broadcast would
        if not group.wait_wanted(current, deadline_s=group.timeout_s):
            raise WorkerError(
                f"weight sync: a rollout rank of this group did not ask for version "
                f"{current + 1} within {group.timeout_s} s (cluster.collective_timeout_s); "
                f"the receivers asked for {group.wanted()} at most"
            )
        version, layout = group.broadcast_object(None, 0)
        for bucket in layout:
            flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=group.device)
            group.broadcast(flat, 0)
            loader(bucket, flat)
        if version > target:
            raise WorkerError(
                f"weight sync: received version {version} while waiting for {target}; the "
                f"actor broadcast a version no receiver was told about"
            )
        current = version
    return current


class WeightSender:
    """An actor rank's end of the transport chosen for one receiving component.

    Args:
        choice: the transport for the receiver (from the plan).
        rank: this actor rank.
        bucket_bytes: the largest bucket.
    """

    def __init__(
        self, choice: TransportChoice, rank: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> None:
        self.choice = choice
        self.rank = rank
        self.bucket_bytes = bucket_bytes
        self._ipc: Any = None
        self._collective: CollectiveSender | None = None
        self._lock = threading.Lock()

    @property
    def device_bytes(self) -> int:
        """Device bytes this sender holds now, the ``weight_sync`` kind of the actor's ledger
        (``ipc``: buckets not yet loaded by every receiver; ``collective``: the snapshot being
        broadcast, or the bucket moving to the device)."""
        if self._ipc is not None:
            return int(self._ipc.nbytes)
        return self._collective.device_bytes if self._collective is not None else 0

    @property
    def sends(self) -> bool:
        """Whether this rank sends (the host transport exports from rank 0 only)."""
        return self.rank in self.choice.sources

    def join(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """(collective) Open the sync group as its rank 0; receivers join concurrently."""
        if self.choice.name != "collective":
            raise ConfigError(
                f"weight sync: join() serves the collective transport, not {self.choice.name}"
            )
        group = SyncGroup(self.choice.backend or "gloo", host, port, world_size, 0, timeout_s)
        self._collective = CollectiveSender(group, self.bucket_bytes)

    def export(self, named: Sequence[tuple[str, torch.Tensor]], version: int) -> Any:
        """Start moving ``version`` of the weights; returns what the receivers are handed.

        Raises:
            WorkerError: the collective transport before :meth:`join`.
        """
        name = self.choice.name
        if name == "ipc":
            from rltrain.backends.weight_sync.ipc import IpcSender

            if self._ipc is None:
                receivers = self.choice.receivers_of(self.rank) or (0,)
                self._ipc = IpcSender(
                    self.rank, self.bucket_bytes, receivers, _own_handle(), self.choice.receiver
                )
            return self._ipc.publish(list(named), version)
        if name == "collective":
            if self._collective is None:
                raise WorkerError(
                    "weight sync: the collective transport's group was not joined; the runner "
                    "joins it when the job starts"
                )
            self._collective.send(named, version)
            return CollectiveVersion(version)
        return pack_to_host(named, version=version, bucket_bytes=self.bucket_bytes)

    def release(self, version: int | None = None, receiver_rank: int | None = None) -> int:
        """(ipc) ``receiver_rank`` loaded ``version``: free what every receiver has loaded;
        with no version, free every version's buckets (the run ends).

        Returns:
            Device bytes freed.
        """
        if self._ipc is None:
            return 0
        if version is None or receiver_rank is None:
            return self._ipc.release()
        return self._ipc.acknowledge(receiver_rank, version)

    def flush(self, timeout: float | None = None) -> None:
        """(collective) Wait until every version queued was broadcast (each starts once every
        receiver takes it).

        Raises:
            WorkerError: a broadcast failed or did not finish in ``timeout`` seconds.
        """
        if self._collective is not None:
            self._collective.flush(timeout)

    def close(self) -> None:
        """(collective) Stop the broadcast thread; versions not yet broadcast are dropped."""
        if self._collective is not None:
            self._collective.close()


def _own_handle() -> Any:
    """This actor's Ray handle (what IPC receivers acknowledge to), or None outside Ray (Ray
    is only looked up, never imported: a GPU check may run without it installed)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        return ray.get_runtime_context().current_actor
    except RuntimeError:  # a driver or task, not an actor
        return None


def acknowledge_ipc(
    weights: Any,
    feeders: Sequence[int],
    receiver_rank: int,
    timeout_s: float,
    wait: Callable[[list[Any]], Any] | None = None,
) -> int:
    """(ipc) Tell every feeding actor rank that this receiver loaded its payload, and wait
    until they have freed what every receiver has loaded (so the room is there before this
    receiver allocates more: vLLM's KV cache wakes next).

    Args:
        weights: what the receiver was handed (actor rank -> IPC payload); anything else
            (host buckets, a collective marker) needs no acknowledgement.
        feeders: the actor ranks this receiver read from.
        receiver_rank: this receiver's rank.
        timeout_s: how long to wait for the actor ranks (``cluster.collective_timeout_s``).
        wait: resolves the acknowledgement calls (``ray.get``; a test may pass another).

    Returns:
        The number of actor ranks acknowledged to.

    Raises:
        WorkerError: an actor rank did not answer within ``timeout_s``.
    """
    if not isinstance(weights, dict):
        return 0
    payloads = [weights[a] for a in feeders if getattr(weights[a], "owner", None) is not None]
    calls = [p.owner.release_weights.remote(p.receiver, p.version, receiver_rank) for p in payloads]
    if not calls:
        return 0
    if wait is None:
        import ray

        def wait(refs: list[Any]) -> Any:
            return ray.get(refs, timeout=timeout_s)

    try:
        wait(calls)
    except TimeoutError:
        raise WorkerError(
            f"weight sync: actor ranks {[p.sender_rank for p in payloads]} did not free their "
            f"IPC buckets within {timeout_s} s (cluster.collective_timeout_s)"
        ) from None
    return len(calls)


def payload_for(weights: Any, feeders: Sequence[int]) -> Any:
    """What one receiver process loads from what the driver handed it.

    Args:
        weights: :class:`HostBuckets`, :class:`CollectiveVersion`, or a mapping of actor rank ->
            :class:`~.ipc.IpcPayload` (``ipc``: the payloads of every sending rank).
        feeders: the actor ranks this receiver reads from (one per device for ``ipc``).

    Returns:
        The host buckets or collective marker as given; for ``ipc`` the payloads of ``feeders``
        in device order.

    Raises:
        WorkerError: an IPC payload of a feeder is missing.
    """
    if isinstance(weights, dict):
        missing = [a for a in feeders if a not in weights]
        if missing:
            raise WorkerError(
                f"weight sync: IPC payloads of actor ranks {missing} were not handed over (got "
                f"{sorted(weights)}); every actor rank on the receiver's GPUs must export"
            )
        return [weights[a] for a in feeders]
    return weights


def weight_version(weights: Any) -> int:
    """The version a handed-over weights object carries."""
    if isinstance(weights, dict):
        return min(p.version for p in weights.values())
    if isinstance(weights, HostBuckets | CollectiveVersion):
        return weights.version
    raise WorkerError(f"weight sync: cannot read a version from {type(weights).__name__}")
