"""The published figures' path: each setup's fit reproduces the stage times it was fitted to."""

from __future__ import annotations

import math

import pytest

from rltrain.whatif.papers import FIGURES, fit, predict_layout, reproduce


def test_every_figure_names_its_source():
    assert len(FIGURES) >= 3
    assert all(f.setup.source.startswith("https://") for f in FIGURES)


def test_the_fit_reproduces_the_profiled_layout_and_predicts_the_other():
    f = next(f for f in FIGURES if f.other is not None and not f.stage)
    mean, u = fit(f.setup)
    assert 64 < mean < f.setup.max_response and 0 < u <= 1
    p = predict_layout(f.setup, f.setup.fit_layout, mean, u)
    assert p.stages_s["generate"] == pytest.approx(f.setup.fit_generate_s, rel=0.01)
    assert p.stages_s["train"] == pytest.approx(f.setup.fit_train_s, rel=0.02)
    ratio = reproduce(f)
    assert math.isfinite(ratio) and ratio > 0
