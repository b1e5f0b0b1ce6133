"""What of the CUDA-IPC path can be checked without a GPU: payload selection and refusals."""

from __future__ import annotations

import pytest
import torch

from rltrain.backends.weight_sync.ipc import IpcPayload, IpcSender, receive_ipc, select_payload
from rltrain.errors import ConfigError, PlacementError


def _payload(rank: int) -> IpcPayload:
    return IpcPayload(sender_rank=rank, device_uuid=f"GPU-{rank}", version=3, buckets=())


def test_select_payload_follows_the_rank_map() -> None:
    payloads = {0: _payload(0), 1: _payload(1)}
    assert select_payload(payloads, {0: 1, 1: 0}, rollout_rank=0).sender_rank == 1
    with pytest.raises(PlacementError, match="not in the IPC rank map"):
        select_payload(payloads, {0: 1}, rollout_rank=5)
    with pytest.raises(PlacementError, match="actor rank 7, which published no"):
        select_payload(payloads, {0: 7}, rollout_rank=0)


def test_ipc_refuses_cpu_tensors_and_missing_targets() -> None:
    with pytest.raises(ConfigError, match="one CUDA device"):
        IpcSender().publish([("w", torch.zeros(3))], version=0)
    with pytest.raises(ConfigError, match="needs params"):
        receive_ipc(_payload(0))
