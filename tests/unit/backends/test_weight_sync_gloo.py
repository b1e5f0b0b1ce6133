"""The disaggregated (NCCL on GPUs) broadcast path, run with gloo between two CPU processes."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp

from rltrain.backends.deepspeed_engine import free_port
from rltrain.backends.weight_sync.collective import SyncGroup, broadcast_weights

TIMEOUT_S = 60


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    model[1].to(torch.bfloat16)  # mixed dtypes share buckets
    return model


def _receiver(port: int) -> None:
    torch.set_num_threads(1)
    group = SyncGroup("gloo", "127.0.0.1", port, world_size=2, rank=1, timeout_s=TIMEOUT_S)
    model = _model(seed=1)
    written = broadcast_weights(group, src=0, params=dict(model.named_parameters()))
    # Send what we now hold back to rank 0, which compares it with what it sent.
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    group.broadcast_object((written, state), src=1)


def test_bucketed_broadcast_between_two_processes() -> None:
    port = free_port()
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_receiver, args=(port,), daemon=True)
    proc.start()
    try:
        group = SyncGroup("gloo", "127.0.0.1", port, world_size=2, rank=0, timeout_s=TIMEOUT_S)
        model = _model(seed=0)
        named = list(model.named_parameters())
        # 300-byte buckets over tensors of 2048, 128, 512 and 16 B: no two fit together once
        # aligned, so four buckets, whose bytes add up to the tensors' bytes.
        sent = broadcast_weights(group, src=0, named=named, bucket_bytes=300)
        written, got = group.broadcast_object(None, src=1)
        assert sent == 2048 + 128 + 512 + 16
        assert written == 4
        for name, p in named:
            assert got[name].dtype == p.dtype and torch.equal(got[name], p.detach()), name
    finally:
        proc.join(timeout=TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
