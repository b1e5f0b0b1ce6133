"""Raw-bytes pickling of tensor records: exact round trips, in-band and out of band."""

from __future__ import annotations

import pickle

import pytest
import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.wire import INBAND_MAX_BYTES, pack, unpack
from rltrain.workers.reward import Scores


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12, dtype=torch.int64).view(3, 4),
        torch.tensor(3.5),  # 0-dim
        torch.empty(0, 7),
        torch.randn(5, 6).to(torch.bfloat16),  # no NumPy dtype
        torch.tensor([True, False, True]),
        torch.randn(6, 5).t(),  # not contiguous
        torch.randn(INBAND_MAX_BYTES // 4 + 1),  # just over the in-band limit
    ],
)
def test_tensors_round_trip_bit_for_bit(tensor):
    back = pickle.loads(pickle.dumps(pack(tensor), protocol=5))
    out = unpack(back)
    assert out.dtype == tensor.dtype and out.shape == tensor.shape
    as_bytes = tensor.contiguous().view(-1).view(torch.uint8)
    assert torch.equal(out.view(-1).view(torch.uint8), as_bytes)


def test_small_tensors_travel_as_bytes_large_ones_out_of_band():
    assert pack(torch.zeros(10))[0] == "b"
    big = torch.zeros(INBAND_MAX_BYTES // 4 + 1)
    buffers: list = []
    pickle.dumps(pack(big), protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1  # the tensor's bytes left the pickle stream (zero-copy in Ray)


def test_read_only_out_of_band_buffers_give_writable_tensors():
    big = torch.arange(INBAND_MAX_BYTES, dtype=torch.int32)
    packed = pack(big)
    array = packed[1].copy()
    array.flags.writeable = False  # as Ray hands a buffer out of its object store
    out = unpack((packed[0], array, *packed[2:]))
    out += 1  # no warning, no write into the shared buffer
    assert torch.equal(out, big + 1)


def test_values_other_than_cpu_tensors_pickle_as_they_are():
    leaf = torch.ones(2, requires_grad=True)
    assert pack(leaf)[0] == "v" and pack(None) == ("v", None) and pack(16) == ("v", 16)


def test_records_round_trip_with_optional_fields_and_plain_values():
    batch = RolloutBatch(
        prompt_ids=torch.tensor([[0, 5, 6]]),
        prompt_mask=torch.tensor([[0, 1, 1]]),
        response_ids=torch.tensor([[7, 1]]),
        response_mask=torch.tensor([[1.0, 1.0]]),
        group_size=4,
        rewards=torch.tensor([1.0]),
    )
    back = pickle.loads(pickle.dumps(batch))
    assert back.group_size == 4 and back.old_logprobs is None
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "rewards"):
        assert torch.equal(getattr(back, name), getattr(batch, name))
    scores = pickle.loads(pickle.dumps(Scores(torch.tensor([0.0, 1.0]), torch.tensor([2, 3]))))
    assert scores.rewards.tolist() == [0.0, 1.0] and scores.response_tokens.tolist() == [2, 3]


def test_weight_buckets_round_trip_out_of_band():
    from rltrain.backends.weight_sync.host import load_from_host, pack_to_host

    named = [("a", torch.randn(300, 100)), ("b", torch.arange(10.0))]
    host = pack_to_host(named, version=3, bucket_bytes=64 * 1024)
    buffers: list = []
    blob = pickle.dumps(host, protocol=5, buffer_callback=buffers.append)
    assert buffers  # the 120 KB bucket went out of band
    back = pickle.loads(blob, buffers=buffers)
    dst = {"a": torch.zeros(300, 100), "b": torch.zeros(10)}
    load_from_host(back, dst)
    assert back.version == 3 and all(torch.equal(dst[k], v) for k, v in named)
