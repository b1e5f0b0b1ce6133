"""DeepSpeed with ``actor.max_tokens_per_micro_batch`` (CPU, gloo world of one): a varying number
of token-budget micro-batches per step, one optimizer step per minibatch, the one-shot gradient."""

from __future__ import annotations

import copy

import pytest
import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, add_advantages
from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.tasks.model import build_model


def _skewed_batch() -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1, 1, 6, 1, 2, 1, 6, 1])  # mostly short, two at the full 6
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    prompt_mask = (
        torch.arange(4)[None, :] >= torch.tensor([1, 2, 0, 1, 3, 1, 2, 0])[:, None]
    ).long()
    return RolloutBatch(
        prompt_ids=torch.randint(3, 20, (8, 4), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, 20, (8, 6), generator=g) * mask.long(),
        response_mask=mask,
        group_size=4,
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]),
    )


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_token_budget_steps_equal_the_one_shot_steps(stage: int, deepspeed_world) -> None:
    from rltrain.backends.training import DeepSpeedEngine, TorchEngine

    torch.set_num_threads(1)
    run = RunConfig()
    run.actor.backend, run.actor.zero_stage = "deepspeed", stage
    run.model = ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3, dtype="float32")
    run.algorithm.num_minibatches = 2  # old log-probs first, under the budget too
    batch = add_advantages(_skewed_batch(), UpdateSettings.from_config(run))
    budget = copy.deepcopy(run)
    budget.actor.max_tokens_per_micro_batch = 12  # the widest row pads to 4 + 6 = 10

    one_shot = TorchEngine(run, build_model(run.model), torch.device("cpu"), 0)
    ds = DeepSpeedEngine(budget, build_model(run.model), torch.device("cpu"), 4, 4)
    assert ds.ds_settings.grad_accum_steps == 1  # the engine marks the boundaries itself
    one_shot.setup(1)
    ds.setup(1)
    seen: list[tuple[int, int]] = []
    ds.model.register_forward_hook(
        lambda m, args, kw, out: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    expected = one_shot.update(batch, torch.Generator().manual_seed(0))
    got = ds.update(batch, torch.Generator().manual_seed(0))
    assert expected["actor/grad_norm"] > 0
    if stage > 0:  # ZeRO-0 reports no norm: its plain AdamW's first moments hold the gradients
        assert got["actor/grad_norm"] == pytest.approx(expected["actor/grad_norm"], rel=1e-4)
    else:
        mine, ref = ds.actor.engine.optimizer.state, one_shot.optimizer.state
        pairs = zip(ds.model.parameters(), one_shot.model.parameters(), strict=True)
        for a, b in pairs:
            assert torch.allclose(mine[a]["exp_avg"], ref[b]["exp_avg"], atol=1e-7, rtol=1e-4)
    assert got["actor/pg_loss"] == pytest.approx(expected["actor/pg_loss"], abs=1e-5)
    assert ds.actor.engine.global_steps == 2  # one optimizer step per minibatch
    assert all(rows * width <= 12 for rows, width in seen)
    assert sum(rows for rows, _ in seen) == 8 + 8 and len(seen) > 1 + 2
