"""Collocated weight sync through CUDA IPC: trainer buffers shared in place on the GPU.

When the actor and the rollout share GPUs, each actor rank packs its weights into a few flat
device buckets and publishes CUDA IPC handles of them (torch.multiprocessing's reductions). The
rollout rank on the *same* GPU opens those handles, copies the bytes into its own parameters,
and lets go. The rank map says which actor rank a rollout rank reads from: the one on its own
device (:func:`collocated_rank_map`), so with tensor parallel rollout every shard takes its bytes
from its own GPU and nothing crosses the bus.

The buckets are a second full copy of the weights on the GPU, so they live only as long as a
receiver needs them: each receiver, once it has loaded a version, acknowledges it to the
sending actor rank (:func:`~rltrain.backends.weight_sync.transport.acknowledge_ipc`, a call on
the actor's Ray handle the payload carries), and the sender frees every version all its
receivers have loaded (:class:`HeldVersions`) and returns the memory to the driver
(``torch.cuda.empty_cache``) before the receiver goes on, so a vLLM engine wakes its KV cache
into that room. While held they are the actor's ``weight_sync`` bytes in its memory ledger and
in the plan's ``sync`` stage.

Handles are small picklable records, so they travel through Ray's object store or any pipe.
A process that sees its GPUs renumbered (``CUDA_VISIBLE_DEVICES``) finds the right local device
by the GPU's UUID, which the sender records.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rltrain.backends.weight_sync.buckets import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    load_bucket,
    pack_bucket,
    plan_buckets,
)
from rltrain.errors import ConfigError, PlacementError, ResourceError, WorkerError
from rltrain.placement.constraints import collocated_rank_map

__all__ = [
    "HeldVersions",
    "IpcBucket",
    "IpcPayload",
    "IpcSender",
    "collocated_rank_map",
    "device_uuid",
    "local_device_index",
    "open_bucket",
    "receive_ipc",
    "select_payload",
]

# Position of the device index in the argument tuple torch's ``reduce_tensor`` produces for a
# CUDA tensor (``rebuild_cuda_tensor(tensor_cls, size, stride, offset, storage_cls, dtype,
# storage_device, ...)``); the receiver rewrites it to its own index of the same physical GPU.
_DEVICE_ARG = 6

#: This process's published buffers by (sender rank, receiver, version, bucket index). CUDA
#: cannot open an IPC handle in the process that made it ("invalid device context"), so a
#: receiver in the sender's own process reads the buffer itself; weak, so freeing a version
#: (:class:`HeldVersions`) still frees its memory.
_OWN_BUFFERS: weakref.WeakValueDictionary[tuple[int, str, int, int], torch.Tensor] = (
    weakref.WeakValueDictionary()
)


@dataclass(frozen=True)
class IpcBucket:
    """One bucket's layout and the CUDA IPC handle of its device buffer."""

    bucket: Bucket
    handle: tuple[Callable[..., torch.Tensor], tuple[Any, ...]]


@dataclass(frozen=True)
class IpcPayload:
    """What one actor rank publishes for one weight version.

    Attributes:
        sender_rank: the actor rank that packed the buckets.
        device_uuid: UUID of the GPU holding them (``str(get_device_properties(i).uuid)``).
        version: the weight version (the actor's step), so a receiver can refuse stale ones.
        buckets: the buckets, in order.
        owner: the sending actor's Ray handle, which a receiver acknowledges the load to (so
            the buckets are freed); None outside Ray (the sender then frees them itself).
        receiver: the receiving component the buckets were published for (``rollout``,
            ``inference``).
        sender_pid: the publishing process (a receiver in it reads the buffers directly).
    """

    sender_rank: int
    device_uuid: str
    version: int
    buckets: tuple[IpcBucket, ...]
    owner: Any = None
    receiver: str = "rollout"
    sender_pid: int = 0

    def own_buffer(self, index: int) -> torch.Tensor | None:
        """Bucket ``index``'s buffer when this process published it, else None.

        Raises:
            WorkerError: this process published the payload but no longer holds the bucket.
        """
        if self.sender_pid != os.getpid():
            return None
        buf = _OWN_BUFFERS.get((self.sender_rank, self.receiver, self.version, index))
        if buf is None:
            raise WorkerError(
                f"IPC weight sync: version {self.version} of actor rank {self.sender_rank} was "
                f"freed before this process (its sender) loaded it"
            )
        return buf

    @property
    def nbytes(self) -> int:
        return sum(b.bucket.nbytes for b in self.buckets)


def device_uuid(device: torch.device | int) -> str:
    """The UUID of a CUDA device, stable across ``CUDA_VISIBLE_DEVICES`` renumbering."""
    return str(torch.cuda.get_device_properties(device).uuid)


def local_device_index(uuid: str) -> int:
    """This process's index of the GPU with ``uuid``.

    Raises:
        ResourceError: when this process cannot see that GPU (it is not collocated with the
            sender, or its ``CUDA_VISIBLE_DEVICES`` hides it).
    """
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == uuid:
            return i
    raise ResourceError(
        f"CUDA IPC weight sync: GPU {uuid} is not visible in this process "
        f"(CUDA_VISIBLE_DEVICES={torch.cuda.device_count()} devices); IPC needs the actor and "
        f"rollout on the same GPU: use a collocated placement or the NCCL path"
    )


def select_payload(
    payloads: Mapping[int, IpcPayload], rank_map: Mapping[int, int], rollout_rank: int
) -> IpcPayload:
    """The payload a rollout rank must read: the one its actor rank (by the rank map) sent.

    Raises:
        PlacementError: when the rank map does not name this rollout rank, or its actor rank
            published nothing.
    """
    if rollout_rank not in rank_map:
        raise PlacementError(
            f"rollout rank {rollout_rank} is not in the IPC rank map {dict(rank_map)}: build the "
            f"map from the plan with collocated_rank_map"
        )
    actor_rank = rank_map[rollout_rank]
    if actor_rank not in payloads:
        raise PlacementError(
            f"rollout rank {rollout_rank} reads from actor rank {actor_rank}, which published no "
            f"IPC handles (got ranks {sorted(payloads)})"
        )
    return payloads[actor_rank]


class HeldVersions:
    """The buffers of every published version until all of its receivers have loaded it.

    A receiver that loads version ``v`` will never read an older one, so its acknowledgement of
    ``v`` also settles the versions before ``v`` it skipped (an asynchronous run hands the
    newest version only). A version every receiver opened is freed. A version some receiver
    skipped is kept as a spare for the next publish instead: torch counts every handle it sends
    and keeps a block that an unopened handle still counts alive after the sender frees it
    (its IPC "limbo"), so freeing it would leak it; overwriting it is safe, as nobody will read
    it.

    Args:
        receivers: the receiver ranks that read these buffers (each must acknowledge).
    """

    def __init__(self, receivers: Sequence[int]) -> None:
        if not receivers:
            raise PlacementError("IPC weight sync: a sender with no receivers holds nothing")
        self._buffers: dict[int, list[torch.Tensor]] = {}
        self._opened: dict[int, set[int]] = {}  # version -> receivers that loaded exactly it
        self._loaded = dict.fromkeys(receivers, -1)  # receiver rank -> newest version loaded
        self._spares: list[list[torch.Tensor]] = []

    def hold(self, version: int, buffers: list[torch.Tensor]) -> None:
        """Keep ``buffers`` as ``version``'s until its receivers have loaded it."""
        self._buffers[version] = buffers
        self._opened[version] = set()

    def get(self, version: int) -> list[torch.Tensor] | None:
        """The buffers to pack ``version`` into: its own if still held, else a spare set."""
        if version in self._buffers:
            return self._buffers[version]
        return self._spares.pop() if self._spares else None

    def acknowledge(self, receiver: int, version: int) -> int:
        """Record that ``receiver`` loaded ``version``; settle what every receiver is past.

        Returns:
            Bytes freed.

        Raises:
            WorkerError: a receiver rank this sender does not feed.
        """
        if receiver not in self._loaded:
            raise WorkerError(
                f"IPC weight sync: receiver rank {receiver} acknowledged version {version}, but "
                f"this sender feeds ranks {sorted(self._loaded)}"
            )
        self._loaded[receiver] = max(self._loaded[receiver], version)
        if version in self._opened:
            self._opened[version].add(receiver)
        done = min(self._loaded.values())
        freed = 0
        for v in [v for v in self._buffers if v <= done]:
            buffers = self._buffers.pop(v)
            if self._opened.pop(v) == set(self._loaded):
                freed += sum(b.nbytes for b in buffers)
            else:
                self._spares.append(buffers)
        return freed

    def clear(self) -> int:
        """Drop every version and spare (the run ends); returns the bytes dropped."""
        dropped = self.nbytes
        self._buffers.clear()
        self._opened.clear()
        self._spares.clear()
        return dropped

    @property
    def nbytes(self) -> int:
        """Bytes held now: every version not yet settled, and the spares."""
        sets = [*self._buffers.values(), *self._spares]
        return sum(b.nbytes for bufs in sets for b in bufs)


class IpcSender:
    """Packs a model's tensors into device buckets and publishes their IPC handles.

    A version's buckets stay allocated until every receiver has acknowledged loading it
    (:meth:`acknowledge`; a receiver opens the sender's memory directly), then they are freed.

    Args:
        rank: this actor rank.
        bucket_bytes: the largest bucket.
        receivers: the receiver ranks that read this rank's buckets.
        owner: this actor's Ray handle, put in every payload (None outside Ray).
        receiver: the receiving component's name, put in every payload.
    """

    def __init__(
        self,
        rank: int = 0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        receivers: Sequence[int] = (0,),
        owner: Any = None,
        receiver: str = "rollout",
    ) -> None:
        self.rank = rank
        self.bucket_bytes = bucket_bytes
        self.held = HeldVersions(receivers)
        self.owner, self.receiver = owner, receiver
        self._layout: tuple[Bucket, ...] | None = None

    def publish(
        self, named: Sequence[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], version: int
    ) -> IpcPayload:
        """Pack the tensors (all on one CUDA device) into fresh buckets and return handles.

        Args:
            named: ``(name, tensor)`` pairs or a name -> tensor mapping, e.g.
                ``model.named_parameters()`` materialised as a list.
            version: the weight version (publishing a version still held repacks its buckets).

        Returns:
            The payload to hand to the rollout rank(s) on this GPU.

        Raises:
            ConfigError: when the tensors are not on one CUDA device.
        """
        from torch.multiprocessing.reductions import reduce_tensor

        items = list(named.items()) if isinstance(named, Mapping) else list(named)
        devices = {t.device for _, t in items}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ConfigError(
                f"CUDA IPC weight sync needs every tensor on one CUDA device, got {devices}: "
                f"use the object-store/gloo path on CPU"
            )
        device = next(iter(devices))
        if self._layout is None:
            self._layout = plan_buckets(items, self.bucket_bytes)
        tensors = dict(items)
        # A version a receiver may still read is never overwritten: its own buffers if it is
        # republished, else a spare set nobody will read, else fresh ones.
        held = self.held.get(version)
        buffers = [
            pack_bucket(bucket, tensors, held[i] if held else None)
            for i, bucket in enumerate(self._layout)
        ]
        self.held.hold(version, buffers)
        for i, buf in enumerate(buffers):
            _OWN_BUFFERS[(self.rank, self.receiver, version, i)] = buf
        layout = zip(self._layout, buffers, strict=True)
        out = tuple(IpcBucket(b, reduce_tensor(buf)) for b, buf in layout)
        # reduce_tensor records an event the receiver waits on; syncing here as well keeps the
        # sender's timeline simple (the receiver never sees half-packed bytes either way).
        torch.cuda.current_stream(device).synchronize()
        return IpcPayload(
            self.rank, device_uuid(device), version, out, self.owner, self.receiver, os.getpid()
        )

    def acknowledge(self, receiver: int, version: int) -> int:
        """``receiver`` loaded ``version``: free what all receivers have loaded.

        Returns:
            Bytes freed (handed back to the driver, so other processes can use them).
        """
        return _returned(self.held.acknowledge(receiver, version))

    def release(self) -> int:
        """Free every version's buckets (the run ends); returns the bytes freed."""
        return _returned(self.held.clear())

    @property
    def nbytes(self) -> int:
        """Device bytes held now (the ``weight_sync`` kind of the actor's ledger)."""
        return self.held.nbytes


def _returned(freed: int) -> int:
    """Give freed blocks back to the driver: the receiver (another process) allocates next.
    ``ipc_collect`` first frees blocks whose handles were released after the sender let go."""
    if freed and torch.cuda.is_available():
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()
    return freed


def open_bucket(item: IpcBucket, device_index: int) -> torch.Tensor:
    """Rebuild one bucket's device buffer in this process from its IPC handle."""
    rebuild, args = item.handle
    args = list(args)
    args[_DEVICE_ARG] = device_index
    return rebuild(*args)


def receive_ipc(
    payload: IpcPayload,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    loader: Callable[[Bucket, torch.Tensor], int] | None = None,
    strict: bool = True,
) -> int:
    """Open a payload's buckets and copy them into this process's tensors.

    Args:
        payload: what the actor rank on this GPU published.
        params: name -> this process's tensor to overwrite (used by the default loader).
        loader: ``loader(bucket, flat) -> tensors written``, to load differently (e.g. a vLLM
            model's ``load_weights``, which slices each tensor for its TP shard).
        strict: with the default loader, refuse names this process does not have.

    Returns:
        The number of tensors written.

    Raises:
        ConfigError: when neither ``params`` nor ``loader`` is given, or the layouts disagree.
        ResourceError: when this process cannot see the sender's GPU.
    """
    if loader is None:
        if params is None:
            raise ConfigError("receive_ipc needs params (name -> tensor) or a loader")

        def loader(bucket: Bucket, flat: torch.Tensor) -> int:
            return load_bucket(bucket, flat, params, strict=strict)

    index = local_device_index(payload.device_uuid)
    written = 0
    for i, item in enumerate(payload.buckets):
        own = payload.own_buffer(i)
        flat = own if own is not None else open_bucket(item, index)
        written += loader(item.bucket, flat)
        # Our copies must finish before the sender may free or overwrite its buffer.
        torch.cuda.current_stream(index).synchronize()
        del flat
    return written
