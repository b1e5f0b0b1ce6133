"""Gradient accumulation over micro-batches: the step equals the one-shot minibatch step."""

from __future__ import annotations

import gc

import pytest
import torch

from rltrain.algorithms import (
    Ranks,
    RolloutBatch,
    UpdateSettings,
    ValueModel,
    accumulate_step,
    add_advantages,
    aggregate,
    micro_slices,
    micro_weights,
    ppo_update,
    rank_token_shares,
    value_update,
)
from rltrain.backends.training import TorchEngine
from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.tasks.model import build_model

T = torch.tensor


# --------------------------------------------------------------------- hand-computed (one weight)
class Scale(torch.nn.Module):
    """``w * x``: the gradient of an aggregated loss is the aggregate of ``x``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(T(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def _token_batch() -> RolloutBatch:
    # rows hold 2, 1 and 3 response tokens: x = 1 2 | 3 | 4 5 6
    x = T([[1, 2, 0], [3, 0, 0], [4, 5, 6]])
    mask = T([[1.0, 1, 0], [1, 0, 0], [1, 1, 1]])
    return RolloutBatch(torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1), x, mask)


def _scale_loss(agg: str):
    def loss_fn(m: torch.nn.Module, mb: RolloutBatch):
        loss = aggregate(m(mb.response_ids.float()), mb.response_mask, agg)
        return loss, {"loss": loss.item()}

    return loss_fn


def test_micro_slices_cover_the_rows_in_order():
    assert [p.tolist() for p in micro_slices(5, 2)] == [[0, 1], [2, 3], [4]]
    assert [p.tolist() for p in micro_slices(5, 0)] == [[0, 1, 2, 3, 4]]
    assert [p.tolist() for p in micro_slices(3, 8)] == [[0, 1, 2]]


def test_weights_are_token_shares_for_token_mean_and_row_shares_otherwise():
    b = _token_batch()
    parts = micro_slices(3, 1)
    assert micro_weights(b.response_mask, parts, "token_mean") == pytest.approx(
        [2 / 6, 1 / 6, 3 / 6]
    )
    assert micro_weights(b.response_mask, parts, "seq_mean_token_mean") == pytest.approx(
        [1 / 3] * 3
    )


@pytest.mark.parametrize(
    ("agg", "grad"),
    [
        ("token_mean", 21 / 6),  # (1+2+3+4+5+6) / 6 tokens
        ("seq_mean_token_mean", (1.5 + 3 + 5) / 3),  # mean of the row means
        ("seq_mean_token_sum", (3 + 3 + 15) / 3),  # mean of the row sums
    ],
)
def test_accumulated_gradient_is_the_hand_computed_minibatch_gradient(agg, grad):
    for micro in (0, 1, 2):
        m = Scale()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        out = accumulate_step(
            m, opt, _token_batch(), _scale_loss(agg), micro_batch=micro, loss_agg=agg
        )
        assert m.w.item() == pytest.approx(-grad, abs=1e-6), micro  # w = 0 - lr * grad
        assert out["grad_norm"] == pytest.approx(grad, abs=1e-6)
        assert out["loss"] == pytest.approx(0.0)  # metrics combine with the same weights


def test_clipping_applies_to_the_accumulated_gradient():
    m = Scale()
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    accumulate_step(m, opt, _token_batch(), _scale_loss("token_mean"), micro_batch=1, grad_clip=1.0)
    assert m.w.item() == pytest.approx(-1.0, abs=1e-5)  # 3.5 clipped to norm 1


def test_rank_shares_make_token_mean_weigh_every_ranks_tokens_alike():
    # Three data-parallel ranks hold 1, 2 and 3 tokens of a minibatch (x = 1 | 2 3 | 4 5 6).
    # The mean over every token is 21 / 6 = 3.5; the mean of the ranks' own means would be
    # (1 + 2.5 + 5) / 3 = 2.83, a token on the short rank weighing three times one on the long.
    rows = [T([[1.0, 0, 0]]), T([[2.0, 3, 0]]), T([[4.0, 5, 6]])]
    masks = [(x > 0).float() for x in rows]
    everyone = T([6.0], dtype=torch.float64)  # what the collective returns on every rank
    ranks = Ranks(3, lambda local: everyone)
    grads = []
    for x, mask in zip(rows, masks, strict=True):
        (share,) = rank_token_shares([mask], "token_mean", ranks)
        assert share == pytest.approx(3 * mask.sum().item() / 6)  # 0.5, 1, 1.5
        m = Scale()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        batch = RolloutBatch(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1), x, mask)
        out = accumulate_step(m, opt, batch, _scale_loss("token_mean"), rank_share=share)
        assert out["loss"] == pytest.approx(0.0)  # metrics stay this rank's own
        grads.append(-m.w.item())
    assert sum(grads) / 3 == pytest.approx(3.5)  # what DDP's average of the gradients gives
    # Row aggregations: every rank holds as many rows; one rank, or none known: 1.
    assert rank_token_shares(masks, "seq_mean_token_mean", ranks) == [1.0, 1.0, 1.0]
    assert rank_token_shares(masks, "token_mean", None) == [1.0, 1.0, 1.0]
    nobody = Ranks(3, lambda local: torch.zeros_like(local))
    assert rank_token_shares([torch.zeros(1, 3)], "token_mean", nobody) == [0.0]


# ----------------------------------------------------------------- the real policy and its loss
def _policy_batch() -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    lengths = T([1, 2, 4, 3, 4, 1, 2, 3])  # uneven: token shares differ from row shares
    mask = (torch.arange(4)[None, :] < lengths[:, None]).float()
    prompt_mask = torch.ones(8, 3, dtype=torch.long)
    prompt_mask[::2, 0] = 0  # some left padding
    b = RolloutBatch(
        prompt_ids=torch.randint(3, 20, (8, 3), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, 20, (8, 4), generator=g) * mask.long(),
        response_mask=mask,
        group_size=4,
        rewards=T([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
    )
    return b


def _model() -> torch.nn.Module:
    torch.set_num_threads(1)
    return build_model(ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_accumulated_ppo_update_equals_the_one_shot_update(agg):
    s = UpdateSettings.of(loss_agg=agg, entropy_coef=0.01, ppo_epochs=2, num_minibatches=2)
    batch = add_advantages(_policy_batch(), s)
    one_shot, accumulated = _model(), _model()
    results = []
    for model, micro in ((one_shot, 0), (accumulated, 3)):  # minibatches of 4 rows: 3 + 1
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(7)
        results.append(ppo_update(model, opt, batch, s, generator=gen, micro_batch=micro))
    moved = 0.0
    for (name, a), b in zip(one_shot.named_parameters(), accumulated.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), name
        moved = max(moved, float((a - _model().get_parameter(name)).detach().abs().max()))
    assert moved > 1e-3  # the update really changed the weights
    assert results[0]["actor/grad_norm"] == pytest.approx(results[1]["actor/grad_norm"], rel=1e-5)
    assert results[0]["actor/pg_loss"] == pytest.approx(results[1]["actor/pg_loss"], abs=1e-6)


def test_torch_engine_splits_minibatches_into_micro_batches():
    run = RunConfig()
    run.algorithm.num_minibatches = 2
    s = UpdateSettings.from_config(run)
    batch = add_advantages(_policy_batch(), s)
    engines = [TorchEngine(run, _model(), torch.device("cpu"), micro) for micro in (0, 3)]
    rows_seen: list[list[int]] = [[], []]
    for engine, seen in zip(engines, rows_seen, strict=True):
        engine.model.register_forward_hook(
            lambda m, args, kw, out, seen=seen: seen.append(kw["input_ids"].shape[0]),
            with_kwargs=True,
        )
        engine.update(batch, torch.Generator().manual_seed(0))
    # old log-probs (8 rows in micro-batches), then two minibatches of 4 rows each
    assert rows_seen[0] == [8, 4, 4]
    assert rows_seen[1] == [3, 3, 2, 3, 1, 3, 1]
    for a, b in zip(engines[0].model.parameters(), engines[1].model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_ddp_wrapped_model_syncs_only_on_the_last_micro_batch(tmp_path):
    """One-process gloo world: DDP's ``no_sync`` is entered for every micro-batch but the last."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    class CountingDDP(DistributedDataParallel):
        entered = 0

        def no_sync(self):
            CountingDDP.entered += 1
            return super().no_sync()

    def step() -> float:
        model = CountingDDP(Scale())
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        accumulate_step(model, opt, _token_batch(), _scale_loss("token_mean"), micro_batch=1)
        return model.module.w.item()

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        # The DDP model (its reducer holds the process group) is gone when step() returns:
        # a reducer collected after destroy_process_group can hang in gloo's destructor,
        # whichever later test the garbage collector happens to run in.
        w = step()
        gc.collect()
    finally:
        dist.destroy_process_group()
    assert CountingDDP.entered == 2  # three micro-batches
    assert w == pytest.approx(-3.5, abs=1e-6)


def test_accumulated_value_update_equals_the_one_shot_update():
    s = UpdateSettings.of(advantage_estimator="gae", lam=0.9, num_minibatches=2, value_clip=0.5)
    batch = _policy_batch()
    batch = add_advantages(batch.replace(values=0.1 * batch.response_mask), s)
    critics = [ValueModel(_model()) for _ in range(2)]
    for critic, micro in zip(critics, (0, 3), strict=True):
        opt = torch.optim.SGD(critic.parameters(), lr=0.5)
        value_update(
            critic, opt, batch, s, generator=torch.Generator().manual_seed(1), micro_batch=micro
        )
    for (name, a), b in zip(critics[0].named_parameters(), critics[1].parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), name
    assert critics[0].head.bias.item() != 0.0  # the update moved the zero-initialised head
