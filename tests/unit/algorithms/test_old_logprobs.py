"""Where pi_old comes from (``algorithm.old_logprobs``), the truncated importance-sampling
correction (``algorithm.tis_cap``) and the rollout/trainer log-prob gap, against numbers
computed by hand.

The policy here is a bigram table: the logits at a position are the table's row of the token
there, so every log-prob is a hand-computable softmax entry.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from rltrain.algorithms import RolloutBatch
from rltrain.algorithms.losses import policy_loss, truncated_is_weights
from rltrain.algorithms.update import UpdateSettings, actor_loss, ppo_update, with_old_logprobs
from rltrain.config import load_config
from rltrain.config.numerics import old_logprob_pass, resolve_old_logprobs
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.runners.stages import _mean_metrics
from rltrain.workers.common import TrainResult

T = torch.tensor
LOG = math.log


class Bigram(torch.nn.Module):
    """A causal LM whose next-token logits are a row of a table, chosen by the current token."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return types.SimpleNamespace(logits=self.table[input_ids])


# Token 0's row: p = (1/2, 1/4, 1/4); token 1's row: p = (1/8, 3/4, 1/8).
TABLE = torch.log(T([[0.5, 0.25, 0.25], [0.125, 0.75, 0.125], [1 / 3, 1 / 3, 1 / 3]]))


def _batch(rollout: list[list[float]] | None) -> RolloutBatch:
    """One prompt token 0, response (1, 1): log-probs log 1/4 then log 3/4; advantage 1."""
    return RolloutBatch(
        prompt_ids=T([[0]]),
        prompt_mask=T([[1]]),
        response_ids=T([[1, 1]]),
        response_mask=T([[1.0, 1.0]]),
        advantages=T([[1.0, 1.0]]),
        rollout_logprobs=None if rollout is None else T(rollout),
    )


TRAINER = [LOG(0.25), LOG(0.75)]


def test_truncated_importance_weights_by_hand():
    old = T([[LOG(0.5), LOG(0.2)]])
    rollout = T([[LOG(0.25), LOG(0.4)]])
    # pi_old / pi_rollout = 2 and 0.5; the cap 1.5 truncates the first
    torch.testing.assert_close(truncated_is_weights(old, rollout, 1.5), T([[1.5, 0.5]]))


def test_policy_loss_weighs_each_tokens_surrogate_by_hand():
    logp = T([[LOG(0.5), LOG(0.2)]], requires_grad=True)
    old = logp.detach()  # ratio 1: each token's surrogate is -A
    out = policy_loss(logp, old, T([[1.0, -2.0]]), torch.ones(1, 2), is_weights=T([[1.5, 0.5]]))
    # token mean of w * (-A): (1.5 * -1 + 0.5 * 2) / 2 = -0.25
    assert out.loss.item() == pytest.approx(-0.25)
    out.loss.backward()
    # d/dlogp of -w*A*ratio/2 at ratio 1: -w*A/2; the weights carry no gradient
    torch.testing.assert_close(logp.grad, T([[-0.75, 0.5]]))


def test_recompute_weights_the_loss_by_min_of_pi_old_over_pi_rollout():
    model = Bigram(TABLE)
    # the rollout saw 1/8 and 3/4 (another engine's numerics): weights min(2, 2) = 2 and 1
    batch = _batch([[LOG(0.125), LOG(0.75)]])
    s = UpdateSettings.of(old_logprobs="recompute", tis_cap=2.0)
    loss, m = actor_loss(model, batch, s)
    assert loss.item() == pytest.approx(-(2.0 + 1.0) / 2)  # ratio 1, A = 1: -mean(w)
    assert m["actor/tis_weight_mean"] == pytest.approx(1.5)
    assert m["actor/tis_clip_frac"] == pytest.approx(0.5)
    assert m["actor/approx_kl"] == 0.0  # the ratio is against pi_old: exactly 1
    loss.backward()
    # d/dtable[0] of -2*log p(1|0)/2 = -(onehot(1) - p(.|0)) = p - onehot(1)
    torch.testing.assert_close(model.table.grad[0], T([0.5, 0.25 - 1.0, 0.25]))
    # tis_cap=null: no weights, the plain surrogate
    plain, m = actor_loss(Bigram(TABLE), batch, UpdateSettings.of(tis_cap=None))
    assert plain.item() == pytest.approx(-1.0) and "actor/tis_weight_mean" not in m


def test_rollout_takes_the_ratio_against_the_rollouts_log_probs():
    model = Bigram(TABLE)
    batch = _batch([[LOG(0.125), LOG(0.75)]])
    s = UpdateSettings.of(old_logprobs="rollout", tis_cap=2.0, clip_high=0.2)
    batch, known, gap = with_old_logprobs(batch, s, lambda b: pytest.fail("no recompute"))
    assert torch.equal(batch.old_logprobs, batch.rollout_logprobs) and known == {}
    loss, m = actor_loss(model, batch, s, gap)
    # ratios 2 and 1 with A = 1: max(-2, -1.2) = -1.2 and -1; no importance weight (it is 1)
    assert loss.item() == pytest.approx((-1.2 - 1.0) / 2)
    assert "actor/tis_weight_mean" not in m and m["actor/clip_frac"] == pytest.approx(0.5)
    # the gap is taken from this first forward pass: |log 1/4 - log 1/8| = log 2, then 0
    g = gap.metrics()
    assert g["rollout/logprob_gap_mean"] == pytest.approx(LOG(2) / 2)
    assert g["rollout/logprob_gap_max"] == pytest.approx(LOG(2))
    assert g["rollout/logprob_gap_tokens"] == 2


def test_where_pi_old_and_the_gap_come_from():
    rollout = [[LOG(0.125), LOG(0.75)]]
    calls = []

    def recompute(b):
        calls.append(b)
        return T([TRAINER])

    one = UpdateSettings.of(old_logprobs="recompute")
    # one optimizer step: pi_old is the first forward pass (no extra pass), the gap too
    b, known, gap = with_old_logprobs(_batch(rollout), one, recompute)
    assert b.old_logprobs is None and known == {} and gap is not None and not calls
    # several steps: recomputed once, the gap measured against it at once
    two = UpdateSettings.of(old_logprobs="recompute", ppo_epochs=2)
    b, known, gap = with_old_logprobs(_batch(rollout), two, recompute)
    assert len(calls) == 1 and gap is None and known["actor/old_logprobs_s"] >= 0
    assert known["rollout/logprob_gap_max"] == pytest.approx(LOG(2))
    # pi_old handed in (the inference component's) is kept
    given = _batch(rollout).replace(old_logprobs=T([TRAINER]))
    b, known, _ = with_old_logprobs(given, two, recompute)
    assert len(calls) == 1 and known["rollout/logprob_gap_mean"] == pytest.approx(LOG(2) / 2)
    # no rollout log-probs: nothing to compare
    assert with_old_logprobs(_batch(None), one, recompute)[1:] == ({}, None)
    with pytest.raises(ConfigError, match="old_logprobs='rollout' but the batch carries no"):
        with_old_logprobs(_batch(None), UpdateSettings.of(old_logprobs="rollout"), recompute)


def test_an_update_logs_the_gap_and_it_is_zero_when_the_rollout_matches():
    model = Bigram(TABLE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = ppo_update(model, opt, _batch([TRAINER]), UpdateSettings.of(tis_cap=2.0))
    assert out["rollout/logprob_gap_max"] == pytest.approx(0.0, abs=1e-6)
    assert out["actor/tis_weight_mean"] == pytest.approx(1.0)


def _run(**overrides) -> RunConfig:
    run = RunConfig()
    run.placement.component_placement = {"actor,rollout": "all", "reward": "0"}
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(run, section), name, value)
    return run


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        ({}, "recompute"),  # the actor's own (free with one epoch of one minibatch)
        ({"algorithm__kl_in": "reward", "algorithm__kl_coef": 0.1}, "rollout"),  # as it was
        (
            {"algorithm__kl_in": "reward", "algorithm__kl_coef": 0.1, "rollout__backend": "vllm"},
            "recompute",
        ),
        (
            {"algorithm__kl_in": "reward", "algorithm__kl_coef": 0.1, "model__dtype": "bfloat16"},
            "recompute",
        ),
        (
            {"algorithm__kl_in": "reward", "algorithm__kl_coef": 0.1, "rollout__top_p": 0.9},
            "recompute",
        ),
        (
            {"algorithm__kl_in": "reward", "algorithm__kl_coef": 0.1, "trainer__max_staleness": 1},
            "recompute",
        ),
        ({"algorithm__old_logprobs": "rollout", "rollout__backend": "vllm"}, "rollout"),
    ],
)
def test_auto_recomputes_where_the_rollout_is_not_the_actors_numerics(overrides, want):
    assert resolve_old_logprobs(_run(**overrides)) == want


def test_the_extra_forward_pass_only_where_pi_old_is_not_free():
    assert not old_logprob_pass(_run())  # one step per batch: the first forward pass
    assert old_logprob_pass(_run(algorithm__num_minibatches=2))
    assert not old_logprob_pass(
        _run(algorithm__num_minibatches=2, algorithm__old_logprobs="rollout")
    )
    inference = _run(algorithm__num_minibatches=2)
    inference.placement.component_placement["inference"] = "1"
    assert not old_logprob_pass(inference)  # the inference component computes it


def test_refusals_name_the_key():
    with pytest.raises(ConfigError, match="algorithm.old_logprobs='actor' is not valid"):
        load_config(_run(algorithm__old_logprobs="actor"))
    with pytest.raises(ConfigError, match="algorithm.tis_cap=0.5 must be at least 1"):
        load_config(_run(algorithm__tis_cap=0.5))
    assert load_config(_run(algorithm__tis_cap=None)).algorithm.tis_cap is None
    run = _run(algorithm__old_logprobs="rollout")
    run.placement.component_placement = {"actor": "0", "rollout,inference": "1", "reward": "0"}
    with pytest.raises(ConfigError, match="old_logprobs='rollout' with an inference component"):
        load_config(run)


def test_the_step_combines_the_ranks_gaps_over_their_tokens():
    ranks = [
        TrainResult(
            {
                "rollout/logprob_gap_mean": 1.0,
                "rollout/logprob_gap_max": 3.0,
                "rollout/logprob_gap_tokens": 1.0,
                "actor/pg_loss": 1.0,
            },
            {},
        ),
        TrainResult(
            {
                "rollout/logprob_gap_mean": 2.0,
                "rollout/logprob_gap_max": 2.5,
                "rollout/logprob_gap_tokens": 3.0,
                "actor/pg_loss": 3.0,
            },
            {},
        ),
    ]
    out = _mean_metrics(ranks)
    assert out["rollout/logprob_gap_mean"] == pytest.approx((1 * 1 + 2 * 3) / 4)
    assert out["rollout/logprob_gap_max"] == 3.0 and out["rollout/logprob_gap_tokens"] == 4
    assert out["actor/pg_loss"] == 2.0


def test_the_cost_model_counts_the_pass_each_schedule_makes():
    from rltrain.autoplace.profile import old_logprob_passes

    # a KL in the reward keeps the rollout's log-probs synchronously; async recomputes them
    run = _run(algorithm__kl_in="reward", algorithm__kl_coef=0.1, algorithm__num_minibatches=2)
    assert old_logprob_passes(run) == (0, 1)
    assert old_logprob_passes(_run(algorithm__num_minibatches=2)) == (1, 1)
    assert old_logprob_passes(_run()) == (0, 0)  # one step per batch: never a pass
