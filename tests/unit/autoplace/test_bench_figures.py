"""The auto_placement benchmark's figures from hand-made measured rows (no runs)."""

from __future__ import annotations

import pytest

from rltrain.bench.measures.auto_placement import SCENARIOS, Outcome, figures, table


def _outcome(rows, winner, default):
    out = Outcome(SCENARIOS[0], winner=winner, default=default)
    for name, pred, meas in rows:
        err = None if meas is None else 100.0 * (pred - meas) / meas
        out.rows.append(
            {
                "candidate": name,
                "status": "ok" if meas is not None else "excluded",
                "reason": "" if meas is not None else "does not fit",
                "predicted_s": pred,
                "measured_s": meas,
                "error_pct": err,
            }
        )
    out.figures = figures(out)
    return out


def test_figures_hand_computed():
    out = _outcome(
        [("async", 1.0, 1.05), ("fused", 1.6, 1.5), ("turns", 1.62, 1.0), ("dis", 1.0, None)],
        winner="async",
        default="fused",
    )
    f = out.figures
    assert f["auto_measured_rank"] == 2  # "turns" measured faster: 1.0 < 1.05
    assert f["auto_vs_best"] == pytest.approx(1.05)
    assert f["default_vs_auto"] == pytest.approx(1.5 / 1.05)
    assert f["max_abs_error_pct"] == pytest.approx(62.0)  # turns: (1.62 - 1.0) / 1.0
    assert f["candidates_measured"] == 3 and f["default_is_best"] == 0.0
    text = table(out)
    assert "| async (auto) | ok | 1.000 | 1.050 | -4.8 % |" in text
    assert "| dis | excluded: does not fit | 1.000 | - | - |" in text
    assert "auto's measured rank 2 of 3" in text


def test_no_figures_without_the_winner_measured():
    assert _outcome([("fused", 1.0, 1.0)], winner="async", default="fused").figures == {}


def test_scenarios_compose():
    from rltrain.bench.measures.auto_placement import _compose

    for s in SCENARIOS:
        run = _compose(s.overrides)
        assert run.logging.progress is False
    tight = _compose(SCENARIOS[2].overrides)
    assert tight.actor.micro_batch_size == 128
