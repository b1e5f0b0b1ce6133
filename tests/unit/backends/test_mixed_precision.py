"""Mixed precision in the torch training engine: 16-bit compute, fp32 master weights and Adam
state (``rltrain.backends.precision``).

- at an RL learning rate a bf16 actor moves as many weights as an fp32 actor does once its
  weights are rounded to bf16 (pure bf16 training rounds most updates away);
- the plan's actor state terms equal the engine's tensors, byte for byte, in fp32 and bf16
  (with and without LoRA);
- checkpoints keep the fp32 masters, so a resumed bf16 run continues exactly;
- fp16 scales the loss, skips a step whose gradients overflowed and backs the scale off.
"""

from __future__ import annotations

import types

import pytest
import torch
from toy_batches import toy_batch

from rltrain.algorithms import RolloutBatch
from rltrain.config.schema import RunConfig
from rltrain.placement import memory
from rltrain.placement.plan import component_terms
from rltrain.placement.sizes import derive_sizes
from rltrain.placement.types import GIB
from rltrain.workers.actor import ActorWorker

LENGTHS = torch.tensor([1, 2, 4, 3, 4, 1, 2, 3])
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])


def _run(dtype: str, lr: float = 1e-5, lora: int = 0) -> RunConfig:
    run = RunConfig()
    m = run.model
    m.hidden_size, m.intermediate_size, m.num_layers, m.dtype = 64, 128, 2, dtype
    m.vocab_size = memory.DEFAULT_VOCAB_SIZE  # the plan's vocabulary for the built-in model
    run.trainer.train_batch_size, run.rollout.n_samples_per_prompt = 2, 4
    run.optimizer.lr = lr
    run.actor.lora.rank = lora
    return run


def _batch() -> RolloutBatch:
    return toy_batch(LENGTHS.tolist(), rewards=None)


def _actor(run: RunConfig) -> ActorWorker:
    return ActorWorker(run, derive_sizes(run, 1, 1))


def _as_bf16(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().to(torch.bfloat16).clone() for p in model.parameters()]


def _share_changed(dtype: str, steps: int) -> float:
    """Share of the policy's weights, rounded to bf16, that ``steps`` updates changed."""
    actor = _actor(_run(dtype))
    before = _as_bf16(actor.model)
    for step in range(steps):
        actor.train(_batch(), rewards=[REWARDS], step=step)
    after = _as_bf16(actor.model)
    changed = sum(int((a != b).sum()) for a, b in zip(after, before, strict=True))
    return changed / sum(a.numel() for a in after)


def test_bf16_moves_as_many_weights_as_fp32_rounded_at_an_rl_learning_rate():
    fp32 = _share_changed("float32", steps=3)
    bf16 = _share_changed("bfloat16", steps=3)
    assert fp32 > 0.3  # measured 0.51 (2026-11-26): the comparison means something
    # Pure bf16 weights (no fp32 master) kept 0.15 here: each 1e-5 step is below half a bf16 unit.
    assert bf16 >= 0.95 * fp32, (bf16, fp32)


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize(
    ("dtype", "lora"), [("float32", 0), ("bfloat16", 0), ("bfloat16", 4)], ids=str
)
def test_the_plans_actor_state_is_the_engines_tensors(dtype, lora):
    run = _run(dtype, lr=1e-3, lora=lora)
    actor = _actor(run)
    actor.train(_batch(), rewards=[REWARDS], step=0)  # gradients and Adam state exist now
    model, opt = actor.model, actor.optimizer
    trained = [p for p in model.parameters() if p.requires_grad]
    state = [v for st in opt.state.values() for k, v in st.items() if k != "step"]
    engine = {
        "weights": _tensor_bytes(model.parameters()),
        "grads": _tensor_bytes(p.grad for p in trained),
        # Adam's per-parameter step counters are left out: host scalars on a GPU
        "optimizer": _tensor_bytes(state),
    }
    node = types.SimpleNamespace(accelerator_type="sim", device_memory_bytes=4 * GIB)
    planned = component_terms(run, "actor", 1, 1, node, memory.model_dims(run.model))
    assert {k: planned[k] for k in engine} == engine
    if dtype == "bfloat16":  # 2 + 2 + (8 + 4) bytes per trained parameter
        n = sum(p.numel() for p in trained)
        assert (engine["grads"], engine["optimizer"]) == (2 * n, 12 * n)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    report = actor.memory_report()  # the ledger's walk finds the masters declared
    assert report["measured"] == report["declared"]


def test_weight_export_sends_the_compute_dtype():
    actor = _actor(_run("bfloat16", lora=4))
    names = dict(actor.engine.named_weights())
    assert names and all(t.dtype == torch.bfloat16 for t in names.values())
    assert not any(".lora_" in n for n in names)  # merged, under the plain names


def test_a_checkpoint_keeps_the_fp32_masters_and_resumes_exactly(tmp_path):
    run = _run("bfloat16", lr=1e-4)
    straight = _actor(run)
    for step in range(2):
        straight.train(_batch(), rewards=[REWARDS], step=step)
    first = _actor(run)
    first.train(_batch(), rewards=[REWARDS], step=0)
    first.save(str(tmp_path / "ckpt"))
    resumed = _actor(run)
    resumed.load(str(tmp_path / "ckpt"))
    saved, loaded = first.optimizer.masters, resumed.optimizer.masters
    assert all(torch.equal(a, b) for a, b in zip(saved, loaded, strict=True))
    # the masters carry what bf16 cannot: rounding them would lose the checkpoint's updates
    assert any(not torch.equal(m, m.bfloat16().float()) for m in loaded)
    resumed.train(_batch(), rewards=[REWARDS], step=1)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(straight.optimizer.masters, resumed.optimizer.masters, strict=True):
        assert torch.equal(a, b)


def test_loss_scale_rules_by_hand():
    from rltrain.backends.precision import LossScale

    s = LossScale(scale=8.0, growth_interval=2)
    s.update(True)
    assert (s.scale, s.good_steps) == (8.0, 1)
    s.update(True)
    assert (s.scale, s.good_steps) == (16.0, 0)  # two good steps in a row: doubled
    s.update(False)
    assert (s.scale, s.good_steps, s.skipped) == (8.0, 0, 1)  # overflow: halved


def test_fp16_scales_the_loss_and_skips_an_overflowed_step():
    from rltrain.backends.precision import MasterWeightOptimizer

    actor = _actor(_run("float16", lr=1e-3))
    opt = actor.optimizer
    assert isinstance(opt, MasterWeightOptimizer) and opt.loss_scale is not None
    before = [p.detach().clone() for p in actor.model.parameters()]
    opt.loss_scale.scale = 1e38  # the scaled gradients overflow fp16
    result = actor.train(_batch(), rewards=[REWARDS], step=0)
    assert all(torch.equal(a, b) for a, b in zip(before, actor.model.parameters(), strict=True))
    assert opt.loss_scale.skipped == 1 and opt.loss_scale.scale == 5e37
    # the skipped step's gradients are zeroed in place, not dropped: with several ranks they
    # are DDP's buckets, which an offload reaches only through them
    trained = [p for p in actor.model.parameters() if p.requires_grad]
    assert all(p.grad is not None and not p.grad.any() for p in trained)
    assert result.metrics["actor/loss_scale"] == 5e37
    opt.loss_scale.scale = 1024.0
    result = actor.train(_batch(), rewards=[REWARDS], step=1)
    norm = result.metrics["actor/grad_norm"]
    assert 0 < norm < 100  # the loss scale is taken out of the reported norm
    moved = [not torch.equal(a, b) for a, b in zip(before, actor.model.parameters(), strict=True)]
    assert any(moved)
