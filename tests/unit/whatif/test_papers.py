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


def test_continue_on_catalogue_hardware_sits_between_finish_and_restart():
    """A generation-bound split on H20 (2 of 16 GPUs generate): at each swap ``restart`` throws
    the decoded tokens away, ``continue`` keeps them and pays a new prefill of the prefixes,
    ``finish`` pays nothing (its samples are a version older)."""
    from rltrain.whatif.papers import ONE_STEP, Layout

    steps = {
        policy: predict_layout(ONE_STEP, Layout(2, "0-13", "14-15", 1, policy), 880, 0.9).step_s
        for policy in ("finish", "continue", "restart")
    }
    assert steps["finish"] < steps["continue"] < steps["restart"]
