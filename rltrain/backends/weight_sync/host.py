"""CPU weight sync: buckets as flat host tensors, for Ray's object store (or any pickle channel).

The sender packs its tensors into a few flat ``uint8`` CPU buckets (few large objects travel
through the object store far faster than hundreds of small ones; they pickle as raw buffers, see
:mod:`rltrain.wire`); the receivers load them into their own tensors by name. Works
the same whatever device each side computes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rltrain.backends.weight_sync.buckets import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    load_bucket,
    pack_bucket,
    plan_buckets,
)
from rltrain.wire import TensorRecord


@dataclass(frozen=True)
class HostBuckets(TensorRecord):
    """A weight version packed into flat CPU buckets.

    Attributes:
        version: the weight version (the actor's step).
        layout: one :class:`Bucket` per flat tensor.
        flats: the flat ``uint8`` CPU tensors, one per bucket.
    """

    version: int
    layout: tuple[Bucket, ...]
    flats: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.layout)


def pack_to_host(
    named: Sequence[tuple[str, torch.Tensor]],
    version: int = 0,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> HostBuckets:
    """Pack tensors (any device) into flat CPU buckets.

    Args:
        named: ``(name, tensor)`` pairs.
        version: the weight version.
        bucket_bytes: the largest bucket.

    Returns:
        The packed weights.
    """
    items = list(named)
    layout = plan_buckets(items, bucket_bytes)
    cpu = {n: t.detach().to("cpu") for n, t in items}
    flats = tuple(pack_bucket(b, cpu) for b in layout)
    return HostBuckets(version, layout, flats)


def load_from_host(
    packed: HostBuckets, params: Mapping[str, torch.Tensor], *, strict: bool = True
) -> int:
    """Copy packed weights into ``params`` (name -> tensor, any device) in place.

    Returns:
        The number of tensors written.

    Raises:
        ConfigError: for missing names (when strict) or shape/dtype mismatches.
    """
    written = sum(
        load_bucket(b, f, params, strict=strict)
        for b, f in zip(packed.layout, packed.flats, strict=True)
    )
    # The copies' own devices, not the current one: a process may compute on another GPU.
    for device in {t.device for t in params.values() if t.is_cuda}:
        torch.cuda.synchronize(device)
    return written
