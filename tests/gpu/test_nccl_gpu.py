"""The disaggregated path with NCCL between two processes on two GPUs (skipped with fewer).

NCCL refuses two ranks of one group on the same GPU, so this needs a machine with two GPUs;
the same code is tested with gloo on CPU in tests/unit/backends/test_weight_sync_gloo.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from rltrain.backends.deepspeed_engine import free_port
from rltrain.backends.weight_sync.collective import SyncGroup, broadcast_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for NCCL"),
]

TIMEOUT_S = 120


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8))
    return model.to("cuda", torch.bfloat16)


def _rank(rank: int, port: int, outbox: mp.Queue) -> None:
    torch.cuda.set_device(rank)
    group = SyncGroup("nccl", "127.0.0.1", port, world_size=2, rank=rank, timeout_s=TIMEOUT_S)
    model = _model(seed=rank)
    if rank == 0:
        broadcast_weights(group, src=0, named=list(model.named_parameters()), bucket_bytes=4096)
    else:
        broadcast_weights(group, src=0, params=dict(model.named_parameters()))
    outbox.put(
        (rank, {n: p.detach().cpu().view(torch.int16).numpy() for n, p in model.named_parameters()})
    )


def test_nccl_broadcast_between_two_gpus() -> None:
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, outbox), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = dict(outbox.get(timeout=TIMEOUT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=TIMEOUT_S)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    for name, sent in got[0].items():
        assert (got[1][name] == sent).all(), name
