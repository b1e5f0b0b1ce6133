"""``rltrain trace --predicted``'s table: measured against predicted over the steady steps only."""

from __future__ import annotations

import json

import pytest

from rltrain.telemetry import draw, timeline
from rltrain.telemetry.trace import Span

S = 1e6
DEVICES = ["node0/dev0"]


def sp(name, component, devices, process, start_s, dur_s):
    return Span(name, component, tuple(devices), process, start_s * S, dur_s * S, 1)


def trace(step_starts, train_s, startup_s=0.0):
    """Steps of 4 s each: the driver's ``generate_wait``, 2 s of generation on the device, then
    ``train_s`` of training; ``startup_s`` of worker launch before the first step."""
    spans = [sp("launch", "actor", [], "driver", 0, startup_s)] if startup_s else []
    for t in step_starts:
        spans += [
            sp("generate_wait", "driver", [], "driver", t, 2),
            sp("generate", "rollout", DEVICES, "rollout[0]", t, 2),
            sp("train", "actor", DEVICES, "actor[0]", t + 2, train_s),
        ]
    return json.loads(json.dumps(timeline.chrome_trace_with_devices(spans, DEVICES)))


def _row(text, label):
    return next(line.split() for line in text.splitlines() if line.startswith(label))


def test_the_idle_share_is_read_over_the_steady_window_only():
    # measured: 16 s of start-up, then steps at 16, 20, 24, 28 busy 3 s of 4; the window runs
    # from 20 to 28 s: busy 6 of 8 s, idle 25 % (over the whole trace it would be 19 of 31 s)
    measured = trace([16, 20, 24, 28], train_s=1, startup_s=16)
    # predicted: steps at 0, 4, 8, 12 busy 2.5 s of 4; window 4 to 12 s: idle 3 of 8 s, 37.5 %
    predicted = trace([0, 4, 8, 12], train_s=0.5)
    text = draw.compare(measured, predicted)
    assert _row(text, "s/step") == ["s/step", "4.0000", "4.0000", "+0.0%"]
    assert _row(text, "idle node0/dev0") == ["idle", "node0/dev0", "25.0%", "37.5%", "+12.5", "pt"]


@pytest.mark.parametrize("measured_steps", [1, 2])
def test_too_few_steps_print_why_instead_of_a_comparison(measured_steps):
    # Two steps leave no window from the second step's start to the last's: the whole trace,
    # 16 s of start-up included, would be read as the steady state (idle 3 + 16 of 24 s).
    measured = trace([16, 20][:measured_steps], train_s=1, startup_s=16)
    predicted = trace([0, 4, 8, 12], train_s=0.5)
    text = draw.compare(measured, predicted)
    assert f"too few steps to compare (measured {measured_steps})" in text
    assert "trainer.total_steps=3 or more" in text
    assert "idle" not in text and "s/step" not in text


def test_a_prediction_with_too_few_steps_is_named():
    text = draw.compare(trace([16, 20, 24], train_s=1), trace([0, 4], train_s=0.5))
    assert "too few steps to compare (predicted 2)" in text
    assert "whatif.steps=3 or more" in text
