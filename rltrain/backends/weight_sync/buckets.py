"""Flatten named tensors into byte buckets and back: the shared core of every sync path.

A :class:`Bucket` is pure metadata (names, dtypes, shapes, byte offsets): the sender computes
the bucket layout once from its parameters, ships it with the first transfer, and both sides
pack / unpack flat ``uint8`` tensors against it. Mixed dtypes share a bucket because each
entry is viewed back at its byte offset; offsets are aligned so every dtype's view is legal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from rltrain.errors import ConfigError

#: Byte alignment of every entry in a bucket (covers every dtype; friendly to DMA engines).
ALIGN = 256

#: Default bucket size: few enough buckets that per-transfer overheads vanish, small enough to
#: bound the extra device memory a sync needs.
DEFAULT_BUCKET_BYTES = 512 * 1024**2

_DTYPES = {
    str(d): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


@dataclass(frozen=True)
class BucketEntry:
    """One tensor inside a bucket.

    Attributes:
        name: the parameter's name (as in ``named_parameters()``).
        dtype: ``str(torch.dtype)``, e.g. ``"torch.bfloat16"`` (a string so metadata pickles
            without torch objects and compares by value).
        shape: the tensor's shape.
        offset: byte offset in the bucket (a multiple of :data:`ALIGN`).
        nbytes: the tensor's size in bytes.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    """A flat byte buffer's layout: its entries and size (the end of the last entry)."""

    entries: tuple[BucketEntry, ...]
    nbytes: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> tuple[Bucket, ...]:
    """Lay tensors out into buckets of at most ``bucket_bytes`` (a bigger tensor goes alone).

    Entries start at offsets aligned to :data:`ALIGN`; a bucket's size is the end of its last
    entry.

    Args:
        named: ``(name, tensor)`` pairs in the order they should travel.
        bucket_bytes: the largest bucket, in bytes (a single larger tensor still travels alone).

    Returns:
        The buckets, in order.

    Raises:
        ConfigError: when ``bucket_bytes`` is not positive, a name repeats, or a dtype is not
            supported.
    """
    if bucket_bytes <= 0:
        raise ConfigError(f"weight sync bucket_bytes={bucket_bytes} must be positive")
    buckets: list[Bucket] = []
    entries: list[BucketEntry] = []
    end = 0  # end of the last entry; the next one starts at the aligned end
    names: set[str] = set()
    for name, t in named:
        if name in names:
            raise ConfigError(
                f"weight sync: tensor name {name!r} appears twice; names must be unique"
            )
        names.add(name)
        if str(t.dtype) not in _DTYPES:
            raise ConfigError(
                f"weight sync: {name!r} has dtype {t.dtype}, not one of {sorted(_DTYPES)}"
            )
        nbytes = t.numel() * t.element_size()
        offset = _align(end) if entries else 0
        if entries and offset + nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(entries), end))
            entries, offset = [], 0
        entries.append(BucketEntry(name, str(t.dtype), tuple(t.shape), offset, nbytes))
        end = offset + nbytes
    if entries:
        buckets.append(Bucket(tuple(entries), end))
    return tuple(buckets)


def pack_bucket(
    bucket: Bucket, tensors: Mapping[str, torch.Tensor], out: torch.Tensor | None = None
) -> torch.Tensor:
    """Copy the bucket's tensors into one flat ``uint8`` tensor on their device.

    Args:
        bucket: the layout.
        tensors: name -> tensor, holding every entry of the bucket.
        out: a flat uint8 buffer of at least ``bucket.nbytes`` to reuse, or None.

    Returns:
        The flat buffer (``out`` if given).

    Raises:
        ConfigError: when a tensor is missing or its shape/dtype differ from the layout.
    """
    first = tensors[bucket.entries[0].name] if bucket.entries else torch.empty(0)
    if out is None:
        out = torch.empty(bucket.nbytes, dtype=torch.uint8, device=first.device)
    for e in bucket.entries:
        t = tensors.get(e.name)
        _check_entry(e, t, "sender")
        src = t.detach().contiguous().reshape(-1).view(torch.uint8)
        out[e.offset : e.offset + e.nbytes].copy_(src, non_blocking=True)
    return out


def unpack_bucket(bucket: Bucket, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of each entry inside a flat bucket (no copy).

    Args:
        bucket: the layout.
        flat: the flat ``uint8`` tensor that holds the bucket's bytes.

    Returns:
        name -> tensor view with the entry's dtype and shape.

    Raises:
        ConfigError: when ``flat`` is smaller than the bucket.
    """
    if flat.dtype != torch.uint8 or flat.numel() < bucket.nbytes:
        raise ConfigError(
            f"weight sync: got a {flat.dtype} buffer of {flat.numel()} elements for a bucket of "
            f"{bucket.nbytes} bytes; the sender and receiver disagree on the layout"
        )
    out = {}
    for e in bucket.entries:
        raw = flat[e.offset : e.offset + e.nbytes]
        out[e.name] = raw.view(_DTYPES[e.dtype]).view(e.shape)
    return out


def load_bucket(
    bucket: Bucket,
    flat: torch.Tensor,
    params: Mapping[str, torch.Tensor],
    *,
    strict: bool = True,
) -> int:
    """Copy a bucket's tensors into the receiver's own tensors (same names, shapes, dtypes).

    Args:
        bucket: the layout.
        flat: the bucket's bytes (any device; copied to each target's device).
        params: name -> the receiver's tensor to overwrite in place.
        strict: refuse names the receiver does not have; else skip them.

    Returns:
        The number of tensors written.

    Raises:
        ConfigError: for a missing name (when strict) or a shape/dtype mismatch.
    """
    written = 0
    with torch.no_grad():
        for name, src in unpack_bucket(bucket, flat).items():
            dst = params.get(name)
            if dst is None:
                if strict:
                    raise ConfigError(
                        f"weight sync: the sender has {name!r} but the receiver does not; "
                        f"check both sides build the same model (or pass strict=False)"
                    )
                continue
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise ConfigError(
                    f"weight sync: {name!r} is {tuple(src.shape)} {src.dtype} on the sender but "
                    f"{tuple(dst.shape)} {dst.dtype} on the receiver; build both with one config"
                )
            dst.copy_(src, non_blocking=True)
            written += 1
    return written


def _check_entry(e: BucketEntry, t: torch.Tensor | None, side: str) -> None:
    if t is None:
        raise ConfigError(f"weight sync: {e.name!r} is in the bucket layout but not on the {side}")
    if tuple(t.shape) != e.shape or str(t.dtype) != e.dtype:
        raise ConfigError(
            f"weight sync: {e.name!r} is {tuple(t.shape)} {t.dtype} on the {side} but the layout "
            f"says {e.shape} {e.dtype}; re-plan the buckets after changing the model"
        )
