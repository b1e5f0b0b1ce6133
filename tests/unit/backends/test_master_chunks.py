"""The mixed-precision optimizer's chunked step: each parameter is stepped once per update,
an fp32 parameter (its own master) in an early chunk included."""

from __future__ import annotations

import torch

from rltrain.backends.precision import MasterWeightOptimizer


def _adamw(params):
    return torch.optim.AdamW(params, lr=0.1, weight_decay=0.0)


def test_an_fp32_parameter_in_an_early_chunk_is_stepped_once():
    p32 = torch.nn.Parameter(torch.zeros(4))  # fp32: its own master
    p16 = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))  # 16-bit: gets a master
    opt = MasterWeightOptimizer([p32, p16], _adamw, chunk_bytes=16)
    assert opt._chunks == [[0], [1]]  # the fp32 parameter's chunk steps first
    p32.grad, p16.grad = torch.ones(4), torch.ones(4, dtype=torch.bfloat16)
    opt.clip_and_step(0.0)
    assert int(opt.optimizer.state[p32]["step"]) == 1
    assert int(opt.optimizer.state[opt.masters[1]]["step"]) == 1
    plain = torch.nn.Parameter(torch.zeros(4))
    plain.grad = torch.ones(4)
    _adamw([plain]).step()
    assert torch.equal(p32.detach(), plain.detach())  # AdamW's first step: -lr on each entry
    # the gradients stay as fp32 training leaves them
    assert torch.equal(p32.grad, torch.ones(4)) and p16.grad is not None
    assert opt.masters[1].grad is None
