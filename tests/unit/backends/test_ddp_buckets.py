"""DDP's gradient buckets are the ``grads`` state: a state mover's offload empties them and its
reload refills them, in torch's own DistributedDataParallel over a one-process gloo world."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from rltrain.backends.host_allreduce import wrap_data_parallel
from rltrain.backends.offload import StateMover, device_storages


@pytest.fixture
def gloo_world() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a default process group is already up in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_buckets_are_the_grads_and_leave_with_them(gloo_world):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    ddp = wrap_data_parallel(model, torch.device("cpu"), 60.0, host_allreduce=False)
    held: list[torch.Tensor] = []  # the reducer's flat buckets, as its comm hook sees them

    def hook(state, bucket):
        held.append(bucket.buffer())
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    ddp.register_comm_hook(None, hook)
    trained = sum(p.numel() * p.element_size() for p in model.parameters())
    # from the wrap on, before any backward: the gradients are DDP's buckets
    assert device_storages(model)["grads"] == trained
    x = torch.randn(8, 16)
    for _ in range(2):  # DDP rebuilds its buckets after the first iteration
        model.zero_grad(set_to_none=True)
        ddp(x).sum().backward()
    bucket = held[-1].untyped_storage()
    assert {p.grad.untyped_storage().data_ptr() for p in model.parameters()} == {bucket.data_ptr()}
    assert device_storages(model)["grads"] == trained  # one copy: the bucket, counted once
    expected = [p.grad.clone() for p in model.parameters()]
    mover = StateMover(model, None, device="cpu")
    assert mover.offload(["grads"]) == trained
    assert bucket.nbytes() == 0  # the reducer's own buffer is released, not just p.grad
    assert mover.resident_bytes()["grads"] == 0
    assert mover.reload(["grads"]) == trained
    assert bucket.nbytes() == trained
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected, strict=True))
    model.zero_grad(set_to_none=True)
    ddp(x).sum().backward()  # DDP keeps writing into the same, refilled bucket
    assert held[-1].untyped_storage().data_ptr() == bucket.data_ptr()
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected, strict=True))
