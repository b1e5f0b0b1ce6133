"""A new estimator or loss declared in rltrain/config/algorithms.py is read through its entry:
the infra-failure path, the layout's critic rule, the fusion rule and the config reference ask
its properties, never its name."""

from __future__ import annotations

import inspect

import pytest
import torch
from composed import composed_run as compose_run

from rltrain.algorithms import registry as algo_registry
from rltrain.algorithms.advantages import compute_advantages, valid_group_advantages
from rltrain.config import algorithms as vocab
from rltrain.config.reference import registry_names
from rltrain.errors import ConfigError
from rltrain.runners import embodied, fusion, layout

REASONING = {"actor", "rollout", "reward"}


def _best_gap(rewards, mask, *, group_size, **_):
    """A toy group estimator: each score minus its group's best (hand-checkable)."""
    g = rewards.sum(dim=1).view(-1, group_size)
    return (g - g.max(dim=1, keepdim=True).values).reshape(-1)[:, None] * mask, None


@pytest.fixture
def best_gap(monkeypatch):
    monkeypatch.setitem(vocab.ADVANTAGE_ESTIMATORS, "best_gap", vocab.EstimatorSpec(True))
    monkeypatch.setitem(algo_registry.ADVANTAGE_REGISTRY, "best_gap", _best_gap)
    return "best_gap"


def test_infra_failed_rows_leave_any_group_estimators_statistics(best_gap):
    """Groups of 3: [1, 0, 4] with row 2 failed -> over [1, 0]: best 1 -> [0, -1, 0];
    [2, 5, 3] all valid -> best 5 -> [-3, 0, -2]; a group with one valid row gives 0."""
    scores = torch.tensor([1.0, 0.0, 4.0, 2.0, 5.0, 3.0, 7.0, 1.0, 1.0])
    valid = torch.tensor([True, True, False, True, True, True, True, False, False])
    got = valid_group_advantages(scores, valid, 3, best_gap)
    assert got.tolist() == [0.0, -1.0, 0.0, -3.0, 0.0, -2.0, 0.0, 0.0, 0.0]
    adv, _ = compute_advantages(best_gap, scores, torch.ones(9, 2), group_size=3, valid=valid)
    assert adv[:, 0].tolist() == got.tolist() and adv[:, 1].tolist() == got.tolist()


def test_an_estimator_is_called_with_the_keywords_the_registry_documents(monkeypatch):
    """Every keyword of ADVANTAGE_REGISTRY's comment on the whole-batch path, group_size and
    norm_by_std alone on the failed-episode path (so an estimator takes ``**_``)."""
    seen: list[set[str]] = []

    def mean_baseline(rewards, mask, **keywords):
        seen.append(set(keywords))
        g = rewards.sum(dim=1).view(-1, keywords["group_size"])
        return (g - g.mean(dim=1, keepdim=True)).reshape(-1)[:, None] * mask, None

    monkeypatch.setitem(vocab.ADVANTAGE_ESTIMATORS, "mean_baseline", vocab.EstimatorSpec(True))
    monkeypatch.setitem(algo_registry.ADVANTAGE_REGISTRY, "mean_baseline", mean_baseline)
    scores, mask = torch.tensor([1.0, 0.0, 4.0, 2.0]), torch.ones(4, 1)
    compute_advantages("mean_baseline", scores, mask, group_size=2)
    valid = torch.tensor([True, True, False, True])
    adv, _ = compute_advantages("mean_baseline", scores, mask, group_size=2, valid=valid)
    assert adv[:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]
    assert seen == [{"group_size", "norm_by_std", "values", "gamma", "lam"}] + [
        {"group_size", "norm_by_std"}
    ]
    source = inspect.getsource(algo_registry).split("ADVANTAGE_REGISTRY:")[0]
    comment = " ".join(source.replace("#:", "").split())
    signature = (
        "fn(token_rewards [B, R], mask [B, R], *, group_size, norm_by_std, values, gamma, lam)"
    )
    assert signature in comment and "``**_``" in comment


def test_the_built_in_group_estimators_give_their_hand_values_over_valid_rows():
    """[1, 0, 1, x] with x failed: GRPO over [1, 0, 1] (mean 2/3, sample std 0.57735),
    RLOO 1 - 1/2 = 0.5 and 0 - 1 = -1."""
    scores = torch.tensor([1.0, 0.0, 1.0, 9.0])
    valid = torch.tensor([True, True, True, False])
    grpo = valid_group_advantages(scores, valid, 4, "grpo")
    assert grpo.tolist() == pytest.approx([0.57735, -1.1547, 0.57735, 0.0], abs=1e-4)
    assert valid_group_advantages(scores, valid, 4, "rloo").tolist() == [0.5, -1.0, 0.5, 0.0]


def test_an_estimator_that_needs_a_critic_is_held_to_it_by_its_entry(monkeypatch):
    spec = vocab.EstimatorSpec(False, needs_critic=True, batch_wide=True)
    monkeypatch.setitem(vocab.ADVANTAGE_ESTIMATORS, "my_gae", spec)
    run = compose_run()
    run.algorithm.advantage_estimator = "my_gae"
    with pytest.raises(ConfigError, match="advantage_estimator='my_gae' needs a critic"):
        layout.check_components(run, REASONING)
    layout.check_components(run, REASONING | {"critic"})  # placed: accepted
    run.algorithm.advantage_estimator = "grpo"
    with pytest.raises(ConfigError, match="'grpo' does not use one"):
        layout.check_components(run, REASONING | {"critic"})


def test_a_placed_reference_without_the_kl_is_refused():
    run = compose_run()
    assert run.algorithm.kl_coef == 0
    with pytest.raises(ConfigError, match=r"places a reference but algorithm.kl_coef=0.0"):
        layout.check_components(run, REASONING | {"reference"})
    run.algorithm.kl_coef = 0.01
    layout.check_components(run, REASONING | {"reference"})


def test_fusion_is_stopped_by_batch_wide_statistics_not_by_a_missing_group(monkeypatch):
    monkeypatch.setitem(vocab.ADVANTAGE_ESTIMATORS, "per_row", vocab.EstimatorSpec(False))
    run = compose_run()

    def blocked(estimator: str) -> bool:
        run.algorithm.advantage_estimator = estimator
        return any("normalises over the whole batch" in b for b in fusion._setting_blockers(run))

    assert blocked("reinforce_pp") and not blocked("per_row") and not blocked("grpo")


def test_the_embodied_runner_refuses_a_policy_loss_it_would_not_read():
    run = compose_run("experiment=cartpole_hybrid", "algorithm.policy_loss=gspo")
    with pytest.raises(ConfigError, match="algorithm.policy_loss='gspo' with runner=embodied"):
        embodied.check_components(run, set(embodied.REQUIRED))
    embodied.check_components(compose_run("experiment=cartpole_hybrid"), set(embodied.REQUIRED))


def test_the_config_reference_lists_the_vocabularys_names(monkeypatch, best_gap):
    """The reference lists what the vocabulary declares (the shipped names and any added),
    not a fixed list: a loss added as ARCHITECTURE.md says keeps this test passing."""
    assert registry_names("algorithm.advantage_estimator")[-1] == "best_gap"
    monkeypatch.setitem(vocab.POLICY_LOSSES, "toy_loss", vocab.PolicyLossSpec("a toy"))
    losses = registry_names("algorithm.policy_loss")
    assert losses == tuple(vocab.POLICY_LOSSES) and losses[-1] == "toy_loss"
    assert {"ppo_clip", "gspo"} <= set(losses)
