"""Collocated weight sync through CUDA IPC: trainer buffers shared in place on the GPU.

When the actor and the rollout share GPUs, each actor rank packs its weights into a few flat
device buckets and publishes CUDA IPC handles of them (torch.multiprocessing's reductions). The
rollout rank on the *same* GPU opens those handles, copies the bytes into its own parameters,
and lets go; the actor then releases the buckets. The rank map says which actor rank a rollout
rank reads from: the one on its own device (:func:`collocated_rank_map`), so with tensor
parallel rollout every shard takes its bytes from its own GPU and nothing crosses the bus.

Handles are small picklable records, so they travel through Ray's object store or any pipe.
A process that sees its GPUs renumbered (``CUDA_VISIBLE_DEVICES``) finds the right local device
by the GPU's UUID, which the sender records.
"""

from __future__ import annotations

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
from rltrain.errors import ConfigError, PlacementError, ResourceError
from rltrain.placement.constraints import collocated_rank_map

__all__ = [
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
    """

    sender_rank: int
    device_uuid: str
    version: int
    buckets: tuple[IpcBucket, ...]

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


class IpcSender:
    """Packs a model's tensors into device buckets and publishes their IPC handles.

    Buckets stay allocated until :meth:`release` (call it once every receiver has confirmed),
    because a receiver opens the sender's memory directly.

    Args:
        rank: this actor rank.
        bucket_bytes: the largest bucket.
    """

    def __init__(self, rank: int = 0, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.rank = rank
        self.bucket_bytes = bucket_bytes
        self._buffers: list[torch.Tensor] = []
        self._layout: tuple[Bucket, ...] | None = None

    def publish(
        self, named: Sequence[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], version: int
    ) -> IpcPayload:
        """Pack the tensors (all on one CUDA device) and return handles for receivers.

        Args:
            named: ``(name, tensor)`` pairs or a name -> tensor mapping, e.g.
                ``model.named_parameters()`` materialised as a list.
            version: the weight version.

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
        reuse = len(self._buffers) == len(self._layout)
        out = []
        for i, bucket in enumerate(self._layout):
            buf = pack_bucket(bucket, tensors, self._buffers[i] if reuse else None)
            if not reuse:
                self._buffers.append(buf)
            out.append(IpcBucket(bucket, reduce_tensor(buf)))
        # reduce_tensor records an event the receiver waits on; syncing here as well keeps the
        # sender's timeline simple (the receiver never sees half-packed bytes either way).
        torch.cuda.current_stream(device).synchronize()
        return IpcPayload(self.rank, device_uuid(device), version, tuple(out))

    def release(self) -> None:
        """Free the bucket buffers (after every receiver has loaded them)."""
        self._buffers.clear()


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
    for item in payload.buckets:
        flat = open_bucket(item, index)
        written += loader(item.bucket, flat)
        # Our copies must finish before the sender may free or overwrite its buffer.
        torch.cuda.current_stream(index).synchronize()
        del flat
    return written
