"""Algorithms by name: the torch-free vocabulary and the registries hold the same names."""

from __future__ import annotations

import math

import pytest
import torch

from rltrain.algorithms.registry import (
    ADVANTAGE_REGISTRY,
    POLICY_LOSS_REGISTRY,
    get_advantage_estimator,
    get_policy_loss,
    register_policy_loss,
)
from rltrain.config import algorithms as vocab
from rltrain.config.schema import AlgorithmConfig
from rltrain.errors import ConfigError


def test_registries_and_vocabulary_hold_the_same_names():
    get_policy_loss("ppo_clip")  # imports the modules that register
    assert set(POLICY_LOSS_REGISTRY) == set(vocab.POLICY_LOSSES)
    assert set(ADVANTAGE_REGISTRY) == set(vocab.ADVANTAGE_ESTIMATORS)
    assert {"grpo", "dr_grpo", "rloo"} <= set(vocab.group_estimators())
    assert not {"reinforce_pp", "gae"} & set(vocab.group_estimators())
    assert vocab.needs_critic("gae") and not vocab.needs_critic("grpo")


def test_a_name_must_be_declared_before_it_registers():
    with pytest.raises(ValueError, match="rltrain/config/algorithms.py"):
        register_policy_loss("not_declared")


def test_unknown_names_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="algorithm.policy_loss='nope'"):
        get_policy_loss("nope")
    with pytest.raises(ConfigError, match="algorithm.advantage_estimator='nope'"):
        get_advantage_estimator("nope")


def test_the_update_dispatches_to_the_loss_the_config_names():
    """ppo_clip and gspo give different losses on the same tensors (ratios of 1.2214 vs 1.0513
    on row 0: one is clipped at 1.2, the other not)."""
    from rltrain.algorithms.registry import PolicyLossInputs

    x = PolicyLossInputs(
        torch.tensor([[0.2, -0.1]]), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)
    )
    a = AlgorithmConfig(loss_agg="token_mean")
    token = get_policy_loss("ppo_clip")(x, a).loss.item()
    seq = get_policy_loss("gspo")(x, a).loss.item()
    assert token == pytest.approx(-(1.2 + math.exp(-0.1)) / 2, abs=1e-6)
    assert seq == pytest.approx(-math.exp(0.05), abs=1e-6)
