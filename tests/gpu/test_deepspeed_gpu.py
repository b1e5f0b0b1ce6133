"""DeepSpeed offload_states / reload_states on a real GPU: memory leaves and comes back."""

from __future__ import annotations

import pytest
import torch

from rltrain.backends.deepspeed_engine import DeepSpeedActor, DeepSpeedSettings
from rltrain.config.offload import OffloadPolicy

pytestmark = pytest.mark.gpu

GIB = 1024**3


def _free() -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_offload_states_frees_gpu_memory(stage: int, tmp_path) -> None:
    pytest.importorskip("deepspeed")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)])  # 33.6M
    policy = OffloadPolicy("after_stage", frozenset({"weights", "grads", "optimizer"}))
    settings = DeepSpeedSettings(
        zero_stage=stage, dtype="bfloat16", lr=1e-3, micro_batch_size=4, policy=policy
    )
    actor = DeepSpeedActor(model, settings)
    x = torch.randn(4, 2048, device=actor.device, dtype=torch.bfloat16)

    def loss_fn(engine, mb):
        return engine(mb).float().square().mean()

    actor.train_step([x], loss_fn)
    weights = {n: t.detach().clone() for n, t in actor.named_weights()}
    # Two cycles: the second reuses the pinned host buffers kept from the first. The first goes
    # through the residency interface, whose byte count the driver must confirm.
    for cycle in range(2):
        free0 = _free()
        if cycle == 0:
            declared = actor.offload(["weights", "grads", "optimizer"])
        else:
            actor.after_stage()
        free1 = _free()
        if cycle == 0:
            assert free1 - free0 >= 0.95 * declared
        # bf16 weights (67 MB) + fp32 master (134 MB) + Adam (268 MB) at least must leave.
        assert free1 - free0 > 0.35 * GIB
        assert actor.offloaded == {"weights", "grads", "optimizer"}
        actor.reload_states()
        assert free1 - _free() > 0.35 * GIB
        for n, t in actor.named_weights():
            assert torch.equal(t, weights[n]), n
    loss = actor.train_step([x], loss_fn)
    assert loss == loss  # not NaN
