"""``trainer.sampler`` / ``trainer.sampler_window`` / ``rollout.dispatch`` /
``trainer.partial_rollout`` / ``simulate.response_length_median``: refused where they would
change nothing."""

from __future__ import annotations

import pytest
from composed import composed as compose_run

from rltrain.config import load_config
from rltrain.errors import ConfigError

ASYNC = ("placement=disaggregated", "trainer.max_staleness=2")
LONG_TAIL = ("simulate.response_length_median=8", "simulate.rollout_token_latency_ms=5")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["trainer.sampler=newest"], "trainer.sampler='newest' is not valid"),
        (
            ["trainer.sampler=fifo"],
            "trainer.sampler='fifo' with trainer.max_staleness=0 and runner='reasoning'",
        ),
        (
            ["experiment=cartpole_collocated", "trainer.sampler=fifo", "trainer.max_staleness=1"],
            "runner='embodied'",
        ),
        ([*ASYNC, "trainer.sampler_window=1"], "drop trainer.sampler_window"),
        ([*ASYNC, "trainer.sampler=windowed"], "needs trainer.sampler_window=W"),
        ([*ASYNC, "trainer.sampler=windowed", "trainer.sampler_window=0"], "(got 0)"),
        (
            [*ASYNC, "trainer.sampler=windowed", "trainer.sampler_window=3"],
            "set trainer.sampler_window<=2 or trainer.sampler=fifo",
        ),
        (["rollout.dispatch=longest"], "rollout.dispatch='longest' is not valid"),
        (["simulate.response_length_median=8"], "set simulate.rollout_token_latency_ms > 0"),
        (
            [*LONG_TAIL, "whatif.response_length=lognormal"],
            "drop whatif.response_length (or the median)",
        ),
        (["experiment=cartpole_collocated", *LONG_TAIL], "runner='embodied' decodes none"),
        (
            ["placement=disaggregated", "trainer.partial_rollout=continue"],
            "trainer.partial_rollout='continue' with trainer.max_staleness=0",
        ),
        (
            ["placement=auto", "placement.auto.staleness=[0]", "trainer.partial_rollout=restart"],
            "set trainer.max_staleness>=1 (placement=disaggregated) or drop "
            "trainer.partial_rollout",
        ),
        (
            ["experiment=cartpole_collocated", "rollout.dispatch=length_aware"],
            "rollout.dispatch='length_aware' with runner='embodied'",
        ),
    ],
)
def test_a_sampler_that_would_change_nothing_is_refused_with_the_fix(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(compose_run(*overrides))
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        [*ASYNC, "trainer.sampler=fifo"],
        [*ASYNC, "trainer.sampler=windowed", "trainer.sampler_window=2"],
        [*ASYNC, "trainer.sampler=windowed", "trainer.sampler_window=1"],
        ["rollout.dispatch=length_aware"],
        [*ASYNC, "trainer.partial_rollout=continue"],
        ["placement=auto", "trainer.partial_rollout=restart"],  # may pick max_staleness=1
        [*ASYNC, *LONG_TAIL, "trainer.partial_rollout=continue"],
    ],
)
def test_samplers_with_asynchronous_rollout_and_length_aware_dispatch_are_accepted(overrides):
    run = load_config(compose_run(*overrides))
    t = run.trainer
    assert (
        t.sampler != "in_order"
        or run.rollout.dispatch == "length_aware"
        or (t.partial_rollout != "finish")
    )
