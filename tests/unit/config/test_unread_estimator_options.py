"""The refusals of estimator options nobody reads name the estimators that do read them, from
their entries (``EstimatorSpec.reads``, ``needs_critic``), so a new estimator is named too."""

from __future__ import annotations

import pytest
from composed import composed as compose

from rltrain.config import algorithms as vocab
from rltrain.config import load_config
from rltrain.errors import ConfigError


@pytest.fixture
def my_gae(monkeypatch):
    spec = vocab.EstimatorSpec(False, needs_critic=True, batch_wide=True, reads=("gamma", "lam"))
    monkeypatch.setitem(vocab.ADVANTAGE_ESTIMATORS, "my_gae", spec)


def test_lam_set_for_an_estimator_without_it_names_every_reader(my_gae):
    with pytest.raises(ConfigError) as err:
        load_config(compose("algorithm=reinforce_pp", "algorithm.lam=0.9"))
    assert "algorithm.advantage_estimator='reinforce_pp' has no lambda" in str(err.value)
    assert "it is read only by gae and my_gae: drop it" in str(err.value)


def test_value_options_without_a_critic_name_the_estimators_with_one(my_gae):
    with pytest.raises(ConfigError) as err:
        load_config(compose("algorithm=reinforce_pp", "algorithm.value_coef=0.9"))
    assert "trains no critic; it is read only by gae and my_gae (estimators with a critic)" in str(
        err.value
    )
