"""Disaggregated weight sync: a bucketed broadcast over a process group of its own.

The trainer's rank 0 and every rollout process join one :class:`SyncGroup` (NCCL on GPUs, gloo
on CPU: the backend is a parameter, so the same code is tested on CPU). It is built directly
from a ``TCPStore`` and the backend's process-group class, not through
``torch.distributed.init_process_group``, because the trainer and the rollout engines each
already own a default group of their own, which must not be disturbed.

A sync is: the layout (bucket metadata, pickled) broadcast once, then each bucket packed on the
source, broadcast, and loaded into the receivers' own tensors.

The group's store also carries a handshake (:meth:`SyncGroup.want`, :meth:`SyncGroup.wait_wanted`):
a receiver says which version it is about to take, and a broadcast starts only once every
receiver has, so ``timeout_s`` bounds the transfer and never the wait for a receiver that is
still busy generating.
"""

from __future__ import annotations

import datetime
import pickle
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from rltrain.backends.weight_sync.buckets import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    load_bucket,
    pack_bucket,
    plan_buckets,
)
from rltrain.errors import ConfigError

BACKENDS = ("gloo", "nccl")

#: How often a waiting rank reads the receivers' wants from the store: short beside a transfer,
#: long enough that an idle wait costs the store nothing noticeable.
HANDSHAKE_POLL_S = 0.02


class SyncGroup:
    """A standalone process group for weight broadcast (not the process's default group).

    Args:
        backend: ``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors).
        host: address of the store, served by rank 0.
        port: the store's port (pick a free one at run time and share it).
        world_size: processes in the group (trainer source + rollout receivers).
        rank: this process's rank in the group; rank 0 serves the store.
        timeout_s: how long a collective (and joining) may wait.

    Raises:
        ConfigError: for an unknown backend or ``nccl`` without CUDA.
    """

    def __init__(
        self,
        backend: str,
        host: str,
        port: int,
        world_size: int,
        rank: int,
        timeout_s: float = 300.0,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"weight sync backend={backend!r} must be one of {list(BACKENDS)}")
        if backend == "nccl" and not torch.cuda.is_available():
            raise ConfigError(
                "weight sync backend='nccl' needs CUDA in every process of the group: "
                "use 'gloo' on CPU"
            )
        self.backend = backend
        self.rank = rank
        self.world_size = world_size
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else (torch.device("cpu"))
        )
        self.timeout_s = timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
        self._store = dist.PrefixStore("rltrain/weight_sync", store)
        self._handshake = dist.PrefixStore("handshake", self._store)  # apart from gloo's keys
        if backend == "gloo":
            self._pg = dist.ProcessGroupGloo(self._store, rank, world_size, timeout)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._pg = dist.ProcessGroupNCCL(self._store, rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Broadcast ``tensor`` in place from rank ``src`` and wait for it."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self._pg.broadcast([tensor], opts).wait()

    def broadcast_object(self, obj: object, src: int) -> object:
        """Broadcast a picklable object from ``src``; every rank returns it."""
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        data = b""
        if self.rank == src:
            data = pickle.dumps(obj)
            length[0] = len(data)
        self.broadcast(length, src)
        buf = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
        if self.rank == src:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.broadcast(buf, src)
        return obj if self.rank == src else pickle.loads(buf.cpu().numpy().tobytes())

    def barrier(self) -> None:
        """Wait until every rank of the group reaches this point."""
        self.broadcast(torch.zeros(1, device=self.device), 0)

    def want(self, version: int) -> None:
        """(receiver) Announce that this rank is about to take every version up to ``version``.

        Args:
            version: the version this rank will hold once it has taken the broadcasts.
        """
        self._handshake.set(f"want/{self.rank}", str(version))

    def wanted(self) -> int | None:
        """The lowest version announced by the receiver ranks (every rank but 0).

        Returns:
            That version, or None while a receiver has announced none yet.
        """
        keys = [f"want/{r}" for r in range(1, self.world_size)]
        if not self._handshake.check(keys):
            return None
        return min(int(v) for v in self._handshake.multi_get(keys))  # one round trip

    def wait_wanted(
        self, above: int, stop: threading.Event | None = None, deadline_s: float | None = None
    ) -> bool:
        """Wait until every receiver rank has announced a version past ``above``.

        The source waits without a deadline: a receiver announces a version when its next
        generation starts, which may be many generations after the version was sent (a
        receiver that died is reported by Ray, not by this wait). A receiver waiting for its
        peers, which start the same call, passes one.

        Args:
            above: the version every receiver must want more than.
            stop: ends the wait early when set (the sender is closing).
            deadline_s: the longest wait in seconds (None: none).

        Returns:
            True once every receiver wants a version past ``above``; False if ``stop`` was set
            or ``deadline_s`` passed first.
        """
        end = None if deadline_s is None else time.monotonic() + deadline_s
        while True:
            wanted = self.wanted()
            if wanted is not None and wanted > above:
                return True
            if end is not None and time.monotonic() > end:
                return False
            if stop is None:
                time.sleep(HANDSHAKE_POLL_S)
            elif stop.wait(HANDSHAKE_POLL_S):
                return False


def broadcast_weights(
    group: SyncGroup,
    src: int,
    named: Sequence[tuple[str, torch.Tensor]] | None = None,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    loader: Callable[[Bucket, torch.Tensor], int] | None = None,
) -> int:
    """Send weights from rank ``src`` to every other rank of the group, bucket by bucket.

    Args:
        group: the sync group.
        src: the sending rank.
        named: on ``src``: the ``(name, tensor)`` pairs to send (any device; packed on the
            group's device).
        params: on receivers: name -> tensor to overwrite (default loader).
        bucket_bytes: the largest bucket.
        loader: on receivers, ``loader(bucket, flat) -> tensors written`` instead of copying
            into ``params`` by name.

    Returns:
        Bytes sent (on ``src``) or tensors written (on receivers).

    Raises:
        ConfigError: when the sender has no tensors or a receiver has neither params nor loader.
    """
    sender = group.rank == src
    if sender and not named:
        raise ConfigError("broadcast_weights: the source rank must pass named=(name, tensor) pairs")
    if not sender and params is None and loader is None:
        raise ConfigError("broadcast_weights: a receiving rank must pass params or a loader")
    layout = plan_buckets(named, bucket_bytes) if sender else None
    layout = group.broadcast_object(layout, src)
    # Blocking copies when they land on the host: pack_bucket reads them right away.
    to_device = group.device.type == "cuda"
    tensors = {n: t.to(group.device, non_blocking=to_device) for n, t in named} if sender else {}
    done = 0
    for bucket in layout:
        if sender:
            flat = pack_bucket(bucket, tensors)
        else:
            flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=group.device)
        group.broadcast(flat, src)
        if sender:
            done += bucket.nbytes
        elif loader is not None:
            done += loader(bucket, flat)
        else:
            done += load_bucket(bucket, flat, params)
    return done
