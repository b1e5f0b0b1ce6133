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
version when its next generation starts, without the actor waiting for it.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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


class CollectiveSender:
    """Broadcasts weight versions to one sync group from a background thread, in order.

    Args:
        group: the sync group; this process is its rank 0.
        bucket_bytes: the largest bucket.
    """

    def __init__(self, group: SyncGroup, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.group = group
        self.bucket_bytes = bucket_bytes
        self._layout: tuple[Bucket, ...] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync")
        self._sent: deque[Future[int]] = deque()

    def send(self, named: Sequence[tuple[str, torch.Tensor]], version: int) -> int:
        """Snapshot ``named`` into buckets now and queue their broadcast.

        Returns:
            Bytes queued.
        """
        items = list(named)
        if self._layout is None:
            self._layout = plan_buckets(items, self.bucket_bytes)
        device = self.group.device
        tensors = {n: t.detach().to(device) for n, t in items}
        flats = [pack_bucket(b, tensors) for b in self._layout]
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        del tensors
        self._reap()
        self._sent.append(self._pool.submit(self._broadcast, version, self._layout, flats))
        return sum(b.nbytes for b in self._layout)

    def _broadcast(
        self, version: int, layout: tuple[Bucket, ...], flats: list[torch.Tensor]
    ) -> int:
        self.group.broadcast_object((version, layout), 0)
        for flat in flats:
            self.group.broadcast(flat, 0)
        sent = sum(b.nbytes for b in layout)
        flats.clear()  # the snapshot is not kept once every receiver has it
        return sent

    def _reap(self) -> None:
        while self._sent and self._sent[0].done():
            self._sent.popleft().result()  # re-raises a failed broadcast

    @property
    def pending(self) -> int:
        """Versions queued or being broadcast."""
        self._reap()
        return len(self._sent)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued version was broadcast.

        Raises:
            WorkerError: a broadcast failed or did not finish in ``timeout`` seconds.
        """
        while self._sent:
            fut = self._sent.popleft()
            try:
                fut.result(timeout=timeout)
            except TimeoutError:
                raise WorkerError(
                    f"weight sync: a broadcast did not finish within {timeout} s; a receiver "
                    f"never took its version (cluster.collective_timeout_s)"
                ) from None


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
        WorkerError: the source sent a version past ``target`` (the two sides lost step).
    """
    while current < target:
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
        """Device bytes this sender holds now (``ipc``: buckets not yet loaded by every
        receiver; the ``weight_sync`` kind of the actor's ledger)."""
        return self._ipc.nbytes if self._ipc is not None else 0

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
        """(collective) Wait until every version queued was broadcast."""
        if self._collective is not None:
            self._collective.flush(timeout)


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
