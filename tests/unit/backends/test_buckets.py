"""Bucket layout (hand-computed offsets), pack/unpack/load, and the host (object-store) path."""

from __future__ import annotations

import pytest
import torch

from rltrain.backends.weight_sync.buckets import (
    Bucket,
    BucketEntry,
    load_bucket,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)
from rltrain.backends.weight_sync.host import load_from_host, pack_to_host
from rltrain.errors import ConfigError


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(10, generator=g)),  # 40 B
        ("b", torch.randn(3, generator=g).to(torch.bfloat16)),  # 6 B
        ("c", torch.arange(4, dtype=torch.int64)),  # 32 B
    ]


def test_layout_offsets_are_aligned_and_buckets_split() -> None:
    buckets = plan_buckets(_named(), bucket_bytes=300)
    assert buckets == (
        Bucket(
            (
                BucketEntry("a", "torch.float32", (10,), 0, 40),
                BucketEntry("b", "torch.bfloat16", (3,), 256, 6),
            ),
            262,
        ),
        Bucket((BucketEntry("c", "torch.int64", (4,), 0, 32),), 32),
    )
    # A tensor bigger than the bucket size travels alone.
    big = plan_buckets([("x", torch.zeros(100)), ("y", torch.zeros(1))], bucket_bytes=64)
    assert [len(b.entries) for b in big] == [1, 1] and big[0].nbytes == 400


def test_pack_unpack_round_trip_is_bit_exact() -> None:
    named = _named()
    (bucket, *rest) = plan_buckets(named, bucket_bytes=1 << 20)
    assert not rest
    flat = pack_bucket(bucket, dict(named))
    assert flat.dtype == torch.uint8 and flat.numel() == 256 + 256 + 32
    views = unpack_bucket(bucket, flat)
    for name, t in named:
        assert views[name].dtype == t.dtype and torch.equal(views[name], t)


def test_load_into_receiver_and_mismatches() -> None:
    named = _named()
    (bucket,) = plan_buckets(named)
    flat = pack_bucket(bucket, dict(named))
    dst = {n: torch.zeros_like(t) for n, t in named}
    assert load_bucket(bucket, flat, dst) == 3
    assert all(torch.equal(dst[n], t) for n, t in named)
    with pytest.raises(ConfigError, match="'c' but the receiver does not"):
        load_bucket(bucket, flat, {"a": dst["a"], "b": dst["b"]})
    assert load_bucket(bucket, flat, {"a": dst["a"]}, strict=False) == 1
    with pytest.raises(ConfigError, match="build both with one config"):
        load_bucket(bucket, flat, {**dst, "a": torch.zeros(5)})
    with pytest.raises(ConfigError, match="disagree on the layout"):
        unpack_bucket(bucket, flat[:100])


def test_bad_inputs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        plan_buckets(_named(), bucket_bytes=0)
    with pytest.raises(ConfigError, match="appears twice"):
        plan_buckets([("a", torch.zeros(1)), ("a", torch.zeros(1))])
    (bucket,) = plan_buckets(_named())
    with pytest.raises(ConfigError, match="not on the sender"):
        pack_bucket(bucket, {"a": torch.zeros(10)})


def test_host_buckets_sync_a_model_into_another() -> None:
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    torch.manual_seed(1)
    dst = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    packed = pack_to_host(list(src.named_parameters()), version=7, bucket_bytes=300)
    # Tensors of 512, 64, 256 and 16 B: [512] alone; [64]; then 256 at 0 and 16 at 256 (272 B).
    assert packed.version == 7
    assert [[e.name for e in b.entries] for b in packed.layout] == [
        ["0.weight"],
        ["0.bias"],
        ["1.weight", "1.bias"],
    ]
    assert load_from_host(packed, dict(dst.named_parameters())) == 4
    for a, b in zip(src.parameters(), dst.parameters(), strict=True):
        assert torch.equal(a, b)
