"""Each estimator's entry declares which of algorithm.norm_adv_by_std, gamma and lam its
registered function reads (``EstimatorSpec.reads``); the config refuses the others. These tests
hold the declaration to the functions: an option moves an estimator's advantages exactly when
its entry says it reads it."""

from __future__ import annotations

import pytest
import torch

from rltrain.algorithms import compute_advantages
from rltrain.config.algorithms import ADVANTAGE_ESTIMATORS, ESTIMATOR_OPTIONS, estimator_reads

T = torch.tensor
REWARDS = T([1.0, 0.0, 0.0, 0.0])  # one group of four
MASK = T([[1.0, 1.0, 1.0]] * 4)  # three response tokens each
VALUES = T([[0.1, 0.2, 0.3], [0.0, 0.5, 0.1], [0.2, 0.2, 0.2], [0.4, 0.0, 0.3]])

#: Each option at its default and at another value (``compute_advantages``'s keywords).
SETTINGS = {
    "norm_adv_by_std": ("norm_by_std", True, False),
    "gamma": ("gamma", 1.0, 0.5),
    "lam": ("lam", 1.0, 0.5),
}


def _advantages(estimator: str, **kw) -> torch.Tensor:
    adv, _ = compute_advantages(estimator, REWARDS, MASK, group_size=4, values=VALUES, **kw)
    return adv


@pytest.mark.parametrize("estimator", list(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("option", ESTIMATOR_OPTIONS)
def test_an_option_moves_the_advantages_exactly_where_the_entry_reads_it(estimator, option):
    keyword, default, other = SETTINGS[option]
    moved = not torch.allclose(
        _advantages(estimator, **{keyword: default}), _advantages(estimator, **{keyword: other})
    )
    assert moved == estimator_reads(estimator, option)


def test_only_grpo_reads_the_std_division():
    # group mean 1/4, sample std 1/2: grpo 0.75 / 0.5 = 1.5 on the first row, dr_grpo 0.75
    assert _advantages("grpo")[0, 0].item() == pytest.approx(1.5, abs=1e-4)
    assert _advantages("grpo", norm_by_std=False)[0, 0].item() == pytest.approx(0.75)
    assert _advantages("dr_grpo", norm_by_std=True)[0, 0].item() == pytest.approx(0.75)
    assert [n for n in ADVANTAGE_ESTIMATORS if estimator_reads(n, "norm_adv_by_std")] == ["grpo"]
