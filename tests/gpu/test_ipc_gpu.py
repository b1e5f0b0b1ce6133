"""CUDA IPC weight sync between two processes on one GPU (torch.multiprocessing, no Ray): bit
exact, and the sender's buckets freed once the receiver acknowledged its load."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from rltrain.backends.weight_sync.ipc import IpcSender, receive_ipc, select_payload

pytestmark = pytest.mark.gpu

TIMEOUT_S = 120


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Embedding(1000, 256), torch.nn.Linear(256, 512), torch.nn.Linear(512, 1000)
    )
    return model.to("cuda", torch.bfloat16)


def _receiver(inbox: mp.Queue, outbox: mp.Queue) -> None:
    model = _model(seed=1)  # different values than the sender's
    params = dict(model.named_parameters())
    for _ in range(2):
        payloads, rank_map = inbox.get(timeout=TIMEOUT_S)
        written = receive_ipc(select_payload(payloads, rank_map, rollout_rank=0), params)
        outbox.put((written, {n: p.detach().cpu() for n, p in params.items()}))
    # CPU tensors travel as shared-memory handles the parent opens on get: stay alive until then.
    inbox.get(timeout=TIMEOUT_S)


def test_ipc_sync_between_two_processes_is_bit_exact() -> None:
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(inbox, outbox), daemon=True)
    proc.start()
    try:
        model = _model(seed=0)
        # A small bucket size forces several buckets and mixed layouts.
        sender = IpcSender(rank=0, bucket_bytes=300_000)
        for version in range(2):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            payload = sender.publish(list(model.named_parameters()), version=version)
            assert len(payload.buckets) > 2
            inbox.put(({0: payload}, {0: 0}))
            written, got = outbox.get(timeout=TIMEOUT_S)
            assert written == len(got) == 5
            for name, p in model.named_parameters():
                assert torch.equal(got[name], p.detach().cpu()), name
            # the receiver has let go of the handles: acknowledging frees the buckets for real
            # (no block left in torch's IPC limbo), and the driver gets the memory back
            held = sender.nbytes
            assert held == payload.nbytes
            allocated = torch.cuda.memory_allocated()
            assert sender.acknowledge(0, version) == held and sender.nbytes == 0
            assert torch.cuda.memory_allocated() == allocated - held
        assert sender.release() == 0
        inbox.put(None)
    finally:
        proc.join(timeout=TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
