"""StateMover on a real GPU: offload frees device memory (driver-measured), reload restores it.

Runs with only torch (+ omegaconf for rltrain.config) installed: no Ray.
"""

from __future__ import annotations

import pytest
import torch

from rltrain.backends.offload import StateMover, device_storages

pytestmark = pytest.mark.gpu

MIB = 1024**2


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    # ~4 x 4096 x 4096 fp32 = 256 MiB of weights, as many grads, twice that of Adam state.
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 4096, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    return model, opt


def _free() -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def test_offload_frees_and_reload_restores_device_memory() -> None:
    model, opt = _model_and_optimizer()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    adam_before = [s["exp_avg_sq"].clone() for s in opt.state.values()]
    held = device_storages(model, opt)
    assert held["weights"] > 250 * MIB and held["optimizer"] > 500 * MIB

    mover = StateMover(model, opt)
    free0 = _free()
    moved = mover.offload()
    free1 = _free()
    assert moved == sum(held.values())
    assert mover.resident_bytes() == {"weights": 0, "grads": 0, "optimizer": 0}
    assert device_storages(model, opt) == {"weights": 0, "grads": 0, "optimizer": 0}
    # The driver must see (nearly) every byte come back: the allocator's rounding aside.
    assert free1 - free0 >= 0.95 * moved

    mover.reload()
    free2 = _free()
    assert free1 - free2 >= 0.95 * moved
    assert device_storages(model, opt) == held
    for k, v in model.state_dict().items():
        assert v.is_cuda and torch.equal(v, before[k]), k
    for s, ref in zip(opt.state.values(), adam_before, strict=True):
        assert torch.equal(s["exp_avg_sq"], ref)

    # Training goes on with the same Parameter objects the optimizer holds.
    x = torch.randn(8, 4096, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_partial_offload_moves_only_the_named_kinds() -> None:
    model, opt = _model_and_optimizer()
    held = device_storages(model, opt)
    mover = StateMover(model, opt)
    free0 = _free()
    mover.offload(["optimizer"])
    free1 = _free()
    assert free1 - free0 >= 0.95 * held["optimizer"]
    assert mover.resident_bytes() == {**held, "optimizer": 0}
    # The second cycle reuses the pinned host buffer instead of pinning again.
    mover.reload()
    buffers = mover.host_bytes()
    mover.offload(["optimizer"])
    assert mover.host_bytes() == buffers
    mover.reload()
    assert device_storages(model, opt) == held
