"""pi_old's recompute under LoRA adapter dropout: the policy's log-probs in eval mode (no
dropout draw), on the torch and the DeepSpeed engine, with the train mode restored after."""

from __future__ import annotations

import torch
from toy_batches import toy_batch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, add_advantages, behaviour_logprobs
from rltrain.backends.training import build_engine
from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.tasks.model import build_model


def _run(backend: str = "torch") -> RunConfig:
    run = RunConfig()
    run.model = ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3, dtype="float32")
    run.trainer.train_batch_size, run.rollout.n_samples_per_prompt = 2, 4
    run.actor.lora.rank, run.actor.lora.alpha, run.actor.lora.dropout = 4, 8.0, 0.5
    run.actor.backend = backend
    run.algorithm.ppo_epochs = 2  # two optimizer steps: pi_old is recomputed first
    return run


def _batch(run: RunConfig) -> RolloutBatch:
    return add_advantages(toy_batch(), UpdateSettings.from_config(run))


def _modes_of_no_grad_passes(model: torch.nn.Module) -> list[bool]:
    """``model.training`` at each forward pass run without gradients (the recompute's)."""
    seen: list[bool] = []
    model.register_forward_pre_hook(
        lambda m, args: seen.append(m.training) if not torch.is_grad_enabled() else None
    )
    return seen


def test_recomputed_pi_old_has_no_dropout_draw_and_the_mode_is_restored():
    torch.set_num_threads(1)
    run = _run()
    engine = build_engine(run, build_model(run.model), torch.device("cpu"), 8, 8)
    batch, s = _batch(run), UpdateSettings.from_config(run)
    engine.model.train()  # as an update leaves it
    first = behaviour_logprobs(engine.model, batch, s)
    assert engine.model.training
    assert torch.equal(first, behaviour_logprobs(engine.model, batch, s))
    seen = _modes_of_no_grad_passes(engine.model)
    for step in range(2):
        engine.update(batch, torch.Generator().manual_seed(step))
    assert seen == [False, False]  # one recompute per update, both in eval mode
    assert engine.model.training


def test_deepspeed_recomputed_pi_old_has_no_dropout_draw(deepspeed_world):
    torch.set_num_threads(1)
    run = _run("deepspeed")
    engine = build_engine(run, build_model(run.model), torch.device("cpu"), 8, 8)
    engine.setup(1)
    batch = _batch(run)
    engine.actor.engine.train()
    first = engine._logprobs(batch)
    assert engine.actor.engine.training
    assert torch.equal(first, engine._logprobs(batch))
    seen = _modes_of_no_grad_passes(engine.model)
    engine.update(batch, torch.Generator().manual_seed(0))
    assert seen == [False]  # the update's recompute
    assert engine.actor.engine.training
