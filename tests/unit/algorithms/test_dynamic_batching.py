"""Token-budget micro-batches (``actor.max_tokens_per_micro_batch``): the grouping, the trimmed
forward, gradients equal to the one-shot and fixed-size updates, the pre-Ray refusal and the
plan's activation term."""

from __future__ import annotations

import pytest
import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import (
    UpdateSettings,
    add_advantages,
    ppo_update,
    row_lengths,
    token_micro_batches,
    trim_padding,
)
from rltrain.backends.training import build_engine
from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.config.validate import load_config
from rltrain.errors import ConfigError
from rltrain.placement import memory as mem
from rltrain.placement.plan import build_plan, component_terms
from rltrain.placement.types import ClusterSpec
from rltrain.tasks.model import build_model

T = torch.tensor


def _groups(parts: list[torch.Tensor]) -> list[list[int]]:
    return [p.tolist() for p in parts]


# ------------------------------------------------------------------------------- the grouping
def test_row_lengths_read_left_and_right_padding():
    b = RolloutBatch(
        prompt_ids=torch.zeros(3, 3, dtype=torch.long),
        prompt_mask=T([[0, 1, 1], [1, 1, 1], [0, 0, 1]]),
        response_ids=torch.zeros(3, 4, dtype=torch.long),
        response_mask=T([[1.0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]),
    )
    p, r = row_lengths(b)
    assert p.tolist() == [2, 3, 1] and r.tolist() == [2, 1, 0]


# Six rows, prompts of 2 tokens; responses 8, 1, 1, 1, 1, 6: widths 10, 3, 3, 3, 3, 8 (padded
# tokens of a micro-batch = rows x (longest prompt + longest response)).
P6, R6 = [2] * 6, [8, 1, 1, 1, 1, 6]


def test_rows_are_grouped_by_length_into_the_fewest_balanced_micro_batches():
    # 20: {0, 5} = 2 x 10 = 20 and {1, 2, 3, 4} = 4 x 3 = 12 (fixed pairs would cost 20 + 16 +
    # 6 = 42 padded tokens, these 32)
    assert _groups(token_micro_batches(P6, R6, 20)) == [[0, 5], [1, 2, 3, 4]]
    # 30 also needs two; greedy filling would make {0, 5, 1} = 30 and {2, 3, 4} = 9: the
    # balanced cut keeps the largest at 20
    assert _groups(token_micro_batches(P6, R6, 30)) == [[0, 5], [1, 2, 3, 4]]
    # 12: {0} = 10, {5} = 8 ({5, 1} would be 2 x 8 = 16), {1, 2, 3, 4} = 12; costliest first
    assert _groups(token_micro_batches(P6, R6, 12)) == [[1, 2, 3, 4], [0], [5]]
    assert _groups(token_micro_batches(P6, R6, 1000)) == [[0, 1, 2, 3, 4, 5]]  # 6 x 10 = 60


def test_ranks_can_ask_for_more_micro_batches_than_the_budget_needs():
    # three at most 12 tokens (as above); four at most 10: {0}, {1, 2, 3} = 9, {5} = 8, {4} = 3
    assert _groups(token_micro_batches(P6, R6, 20, min_parts=3)) == [[1, 2, 3, 4], [0], [5]]
    assert _groups(token_micro_batches(P6, R6, 20, min_parts=4)) == [[0], [1, 2, 3], [5], [4]]
    # four equal rows of 10: caps below 20 give four groups, 20 gives two; the costlier first
    # half is split to make three
    equal = token_micro_batches([2] * 4, [8] * 4, 40, min_parts=3)
    assert _groups(equal) == [[2, 3], [0], [1]]
    with pytest.raises(ValueError, match="7 micro-batches asked of 6 rows"):
        token_micro_batches(P6, R6, 20, min_parts=7)


def test_a_row_wider_than_the_budget_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as err:
        token_micro_batches(P6, R6, 9)
    msg = str(err.value)
    assert "actor.max_tokens_per_micro_batch=9 is smaller than row 0 alone" in msg
    assert "(2 prompt + 8 response tokens = 10)" in msg
    assert "task.max_prompt_length + rollout.max_new_tokens" in msg
    # a row without response tokens still keeps one response column: 3 + 1
    assert _groups(token_micro_batches([3, 3], [0, 1], 4)) == [[0], [1]]


def test_a_micro_batch_is_cut_to_its_own_padded_width():
    b = RolloutBatch(
        prompt_ids=T([[0, 0, 5, 6], [0, 7, 8, 9]]),
        prompt_mask=T([[0, 0, 1, 1], [0, 1, 1, 1]]),
        response_ids=T([[1, 2, 0, 0, 0], [3, 0, 0, 0, 0]]),
        response_mask=T([[1.0, 1, 0, 0, 0], [1, 0, 0, 0, 0]]),
        rewards=T([1.0, 0.0]),
        advantages=torch.arange(10.0).reshape(2, 5),
    )
    t = trim_padding(b)
    assert t.prompt_ids.tolist() == [[0, 5, 6], [7, 8, 9]]
    assert t.prompt_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert t.response_ids.tolist() == [[1, 2], [3, 0]]
    assert t.advantages.tolist() == [[0.0, 1.0], [5.0, 6.0]]
    assert t.rewards.tolist() == [1.0, 0.0] and t.old_logprobs is None
    assert trim_padding(t) is t  # nothing left that every row pads


# ------------------------------------------------------------------ the update on a real model
def _skewed_batch() -> RolloutBatch:
    """Eight rows, mostly short responses and two at the full 6 tokens, uneven prompts."""
    g = torch.Generator().manual_seed(0)
    lengths = T([1, 1, 6, 1, 2, 1, 6, 1])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    prompt_mask = (torch.arange(4)[None, :] >= T([1, 2, 0, 1, 3, 1, 2, 0])[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.randint(3, 20, (8, 4), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, 20, (8, 6), generator=g) * mask.long(),
        response_mask=mask,
        group_size=4,
        rewards=T([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]),
        ref_logprobs=-torch.rand(8, 6, generator=g) * mask,
    )


def _model() -> torch.nn.Module:
    torch.set_num_threads(1)  # the machine is shared; tiny tensors gain nothing from threads
    return build_model(ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3))


def _record_forwards(model: torch.nn.Module) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    model.register_forward_hook(
        lambda m, args, kw, out: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    return seen


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_token_budget_update_equals_the_one_shot_and_the_fixed_size_updates(agg):
    # the KL in the loss too: its constant normaliser must not follow the trimmed width
    s = UpdateSettings.of(
        loss_agg=agg, entropy_coef=0.01, kl_coef=0.1, ppo_epochs=2, num_minibatches=2
    )
    batch = add_advantages(_skewed_batch(), s)
    models = [_model() for _ in range(3)]
    budgeted = _record_forwards(models[2])
    results = []
    for model, micro, budget in zip(models, (0, 3, 0), (None, None, 12), strict=True):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(7)
        results.append(
            ppo_update(model, opt, batch, s, generator=gen, micro_batch=micro, max_tokens=budget)
        )
    init = _model()
    for name, a in models[0].named_parameters():
        for other in models[1:]:
            assert torch.allclose(a, other.get_parameter(name), atol=1e-6, rtol=1e-5), name
    assert (
        max(
            float((a - init.get_parameter(n)).detach().abs().max())
            for n, a in models[0].named_parameters()
        )
        > 1e-3
    )
    for r in results[1:]:
        assert r["actor/grad_norm"] == pytest.approx(results[0]["actor/grad_norm"], rel=1e-5)
        assert r["actor/pg_loss"] == pytest.approx(results[0]["actor/pg_loss"], abs=1e-6)
        assert r["actor/kl_loss"] == pytest.approx(results[0]["actor/kl_loss"], rel=1e-5)
    # every forward (old log-probs, then 2 epochs x 2 minibatches) held at most 12 tokens
    assert all(rows * width <= 12 for rows, width in budgeted)
    assert sum(rows for rows, _ in budgeted) == 8 + 2 * 8  # each row once per pass
    assert len(budgeted) > 1 + 2 * 2  # some minibatch took several micro-batches


def test_the_torch_engine_reads_the_budget_from_the_config():
    run = RunConfig()
    run.model = ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3)
    run.algorithm.num_minibatches = 2
    run.actor.max_tokens_per_micro_batch = 12
    batch = add_advantages(_skewed_batch(), UpdateSettings.from_config(run))
    engine = build_engine(run, _model(), torch.device("cpu"), micro_batch=4, minibatch=4)
    seen = _record_forwards(engine.model)
    engine.update(batch, torch.Generator().manual_seed(0))
    assert seen and all(rows * width <= 12 for rows, width in seen)
    assert len(seen) > 3  # more than the old log-probs pass + two 4-row micro-batches


# ---------------------------------------------------------------------- checks before Ray starts
def test_a_budget_below_one_full_row_is_refused_before_ray():
    run = RunConfig()
    run.placement.component_placement = {"actor,rollout": "all"}
    run.task.max_prompt_length, run.rollout.max_new_tokens = 20, 12
    run.actor.max_tokens_per_micro_batch = 31
    with pytest.raises(ConfigError) as err:
        load_config(run)
    assert (
        "actor.max_tokens_per_micro_batch=31 is smaller than one full-length row, "
        "task.max_prompt_length + rollout.max_new_tokens = 20 + 12 = 32 tokens: set it to at "
        "least 32"
    ) in str(err.value)
    run.actor.max_tokens_per_micro_batch = 0
    with pytest.raises(ConfigError, match=r"actor.max_tokens_per_micro_batch=0 must be > 0"):
        load_config(run)
    run.actor.max_tokens_per_micro_batch = 32
    assert load_config(run).actor.max_tokens_per_micro_batch == 32
    run.runner, run.task.name = "embodied", "gym"  # no token sequences to budget
    with pytest.raises(ConfigError, match=r"=32 applies to token sequences; runner=embodied"):
        load_config(run)


# --------------------------------------------------------------------------- the memory plan
MID = ModelConfig(
    hidden_size=1024,
    intermediate_size=4096,
    num_layers=8,
    num_heads=8,
    num_kv_heads=8,
    max_position_embeddings=128,
    dtype="bfloat16",
)


def test_the_plan_sizes_actor_activations_from_the_budget():
    d = mem.model_dims(MID)
    # 1000 tokens instead of 64 x 128: 1000*1024 elements x 8 layers x 17 x 2 bytes + logits
    # 1000 x 32 x 4 bytes
    assert mem.activation_bytes(64, 128, d, max_tokens=1000) == 1000 * 1024 * 8 * 17 * 2 + 128_000
    assert mem.activation_bytes(64, 128, d, max_tokens=10**6) == mem.activation_bytes(64, 128, d)
    run = RunConfig()
    run.model = MID
    run.cluster.devices_per_node, run.cluster.device_memory_gib = 4, 16.0
    run.placement.component_placement = {"actor,rollout": "0-1"}
    run.task.max_prompt_length, run.rollout.max_new_tokens = 20, 12  # 32 tokens a row
    node = ClusterSpec.from_config(run.cluster).nodes[0]

    def actor_activations() -> int:
        return component_terms(run, "actor", 2, 1, node, d)["activations"]

    # 64 rows a rank x 32 tokens = 2048 tokens; logits of the 12 response tokens a row (768),
    # 5 fp32 copies
    full = actor_activations()
    assert full == 2048 * 1024 * 8 * 17 * 2 + 768 * 32 * 4 * 5
    run.actor.max_tokens_per_micro_batch = 512  # 16 rows' worth: 192 response tokens
    assert actor_activations() == 512 * 1024 * 8 * 17 * 2 + 192 * 32 * 4 * 5
    run.actor.max_tokens_per_micro_batch = 4096  # more than a whole minibatch holds
    assert actor_activations() == full


def test_a_plan_that_does_not_fit_names_the_budget_not_the_rows():
    run = RunConfig()
    run.model = MID
    run.cluster.devices_per_node, run.cluster.device_memory_gib = 2, 1.0
    run.placement.component_placement = {"actor,rollout": "0-1"}
    run.task.max_prompt_length, run.rollout.max_new_tokens = 20, 12
    run.actor.max_tokens_per_micro_batch = 2048
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    fixes = " ".join(plan.fit_problems()[0].fixes)
    assert "lower actor.max_tokens_per_micro_batch (now 2048, >= 32)" in fixes
    assert "actor.micro_batch_size" not in fixes  # rows do not bound a budgeted micro-batch
