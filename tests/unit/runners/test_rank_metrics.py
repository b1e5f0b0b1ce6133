"""The actor's per-token metrics over data-parallel ranks: each rank weighs by the tokens it
trained, so a rank whose rows all failed (no token trained) does not pull the mean to 0."""

from __future__ import annotations

import pytest

from rltrain.runners.stages import LOSS_TOKENS, _mean_metrics
from rltrain.workers.common import TrainResult


def rank(tokens: float, **metrics: float) -> TrainResult:
    return TrainResult({LOSS_TOKENS: tokens, **{f"actor/{k}": v for k, v in metrics.items()}}, {})


def test_token_metrics_weigh_each_rank_by_its_trained_tokens():
    # 30 tokens at entropy 1.2 and 10 at 0.4: (36 + 4) / 40 = 1.0; the failed rank (0 tokens,
    # its 0.0 placeholders) is left out; grad_norm (not a token metric) is the plain mean
    out = _mean_metrics(
        [
            rank(30, entropy=1.2, tis_weight_mean=1.0, grad_norm=2.0),
            rank(10, entropy=0.4, tis_weight_mean=0.96, grad_norm=2.0),
            rank(0, entropy=0.0, tis_weight_mean=0.0, grad_norm=2.0),
        ]
    )
    assert out["actor/entropy"] == pytest.approx(1.0)
    assert out["actor/tis_weight_mean"] == pytest.approx((30 * 1.0 + 10 * 0.96) / 40)
    assert out["actor/grad_norm"] == 2.0 and out[LOSS_TOKENS] == 40


def test_with_no_token_trained_anywhere_the_token_metrics_are_left_out():
    out = _mean_metrics([rank(0, entropy=0.0, grad_norm=0.0), rank(0, entropy=0.0, grad_norm=0.0)])
    assert "actor/entropy" not in out and out[LOSS_TOKENS] == 0 and out["actor/grad_norm"] == 0.0
