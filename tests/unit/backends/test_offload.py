"""StateMover on CPU ("simulated devices"): bytes leave and come back, values bit-identical."""

from __future__ import annotations

import pytest
import torch

from rltrain.backends.offload import MOVABLE_KINDS, StateMover, device_storages
from rltrain.errors import ConfigError


def _tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)  # weight 6 floats (24 B), bias 2 floats (8 B)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, model.in_features, generator=g)
    opt.zero_grad(set_to_none=False)
    model(x).square().mean().backward()
    opt.step()


def test_bytes_by_kind_are_counted_per_storage() -> None:
    model, opt = _tiny()
    assert device_storages(model, opt) == {"weights": 32, "grads": 0, "optimizer": 0}
    _step(model, opt, 0)
    # Adam keeps exp_avg + exp_avg_sq per parameter (2 x 32 B) and a 4-byte step per parameter.
    assert device_storages(model, opt) == {"weights": 32, "grads": 32, "optimizer": 72}


def test_offload_releases_and_reload_restores_bit_identical() -> None:
    model, opt = _tiny()
    _step(model, opt, 0)
    twin, twin_opt = _tiny()  # built and stepped the same way, sharing no tensor
    _step(twin, twin_opt, 0)
    params = list(model.parameters())
    held = device_storages(model, opt)

    mover = StateMover(model, opt)
    assert mover.offload() == 32 + 32 + 72
    assert mover.offloaded == set(MOVABLE_KINDS)
    assert device_storages(model, opt) == {"weights": 0, "grads": 0, "optimizer": 0}
    assert mover.resident_bytes() == {"weights": 0, "grads": 0, "optimizer": 0}
    # Each storage starts on a 512-byte boundary of its kind's host buffer.
    assert mover.host_bytes() == {"weights": 1024, "grads": 1024, "optimizer": 6 * 512}
    assert mover.reload() == 136
    assert device_storages(model, opt) == held
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]

    # Training continues exactly as on a twin that never left the device.
    for seed in (1, 2):
        _step(model, opt, seed)
        _step(twin, twin_opt, seed)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_partial_offload_and_idempotence() -> None:
    model, opt = _tiny()
    _step(model, opt, 0)
    mover = StateMover(model, opt)
    assert mover.offload(["optimizer"]) == 72
    assert mover.offload(["optimizer"]) == 0  # already off
    assert mover.offloaded_bytes() == {"optimizer": 72}
    assert mover.resident_bytes() == {"weights": 32, "grads": 32, "optimizer": 0}
    assert mover.reload(["weights"]) == 0  # resident: nothing to do
    assert mover.reload() == 72
    assert mover.offloaded == frozenset()
    # The host buffer is kept for the next cycle and reused.
    buf = mover._host["optimizer"]
    mover.offload(["optimizer"])
    assert mover._host["optimizer"] is buf
    mover.reload()
    mover.release_host_buffers()
    assert mover.host_bytes() == {}


def test_shared_storages_stay_shared() -> None:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(5, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = emb.weight  # tied
    model = torch.nn.Sequential(emb, head)
    flat = torch.arange(12, dtype=torch.float32)
    model.register_buffer("a", flat[:6].view(2, 3))  # two views of one storage
    model.register_buffer("b", flat[6:])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert device_storages(model) == {"weights": 80 + 48, "grads": 0, "optimizer": 0}
    mover = StateMover(model)
    assert mover.offload(["weights"]) == 128
    mover.reload()
    assert model[1].weight is model[0].weight
    assert model.a.untyped_storage().data_ptr() == model.b.untyped_storage().data_ptr()
    assert model.b.storage_offset() == 6
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_optimizer_only_mover() -> None:
    model, opt = _tiny()
    _step(model, opt, 0)
    mover = StateMover(None, opt)
    assert mover.offload(["optimizer"]) == 72
    assert device_storages(None, opt) == {"weights": 0, "grads": 0, "optimizer": 0}
    mover.reload()
    assert device_storages(None, opt)["optimizer"] == 72


@pytest.mark.parametrize("kinds", [["kv_cache"], ["weights", "activations"]])
def test_unknown_kinds_are_config_errors(kinds: list[str]) -> None:
    model, opt = _tiny()
    with pytest.raises(ConfigError, match="cannot be moved"):
        StateMover(model, opt).offload(kinds)
