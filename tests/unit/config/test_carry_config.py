"""``trainer.partial_rollout=carry`` / ``trainer.carry_segment`` / ``carry_surplus``: what
carry does not support is refused before Ray, naming the key, the value and the fix."""

from __future__ import annotations

import pytest
from composed import composed as compose_run

from rltrain.config import load_config
from rltrain.errors import ConfigError

CARRY = (
    "placement=disaggregated",
    "trainer.max_staleness=2",
    "trainer.partial_rollout=carry",
    "simulate.response_length_median=8",
    "simulate.rollout_token_latency_ms=5",
)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            [*CARRY, "trainer.max_staleness=1"],
            "carry with trainer.max_staleness=1: a row carried into the next call trains at "
            "least 2 versions",
        ),
        ([*CARRY, "rollout.backend=vllm"], "vLLM would need abort and resume"),
        ([*CARRY, "trainer.sampler=fifo"], "set trainer.sampler=in_order"),
        ([*CARRY, "rollout.dispatch=length_aware"], "set rollout.dispatch=in_order"),
        ([*CARRY, "algorithm.filter_groups=true"], "set algorithm.filter_groups=false"),
        ([*CARRY, "placement.fuse=true"], "set placement.fuse=false"),
        ([*CARRY, "experiment=calc_tool"], "carry with task.env="),
        ([*CARRY, "trainer.carry_segment=0"], "trainer.carry_segment=0: give at least 1"),
        (
            ["placement=disaggregated", "trainer.max_staleness=1", "trainer.carry_segment=4"],
            "trainer.partial_rollout='finish' has none: drop trainer.carry_segment",
        ),
        (["trainer.partial_rollout=carried"], "or 'carry' (unfinished rows are carried"),
        # a surplus of max_staleness steps or more would age every group past the bound
        (
            [*CARRY, "trainer.carry_surplus=2"],
            "trainer.carry_surplus=2 with trainer.max_staleness=2: a group waits about "
            "carry_surplus calls",
        ),
        ([*CARRY, "trainer.max_staleness=7", "trainer.carry_surplus=0"], "give 1..6"),
        (
            [*CARRY, "placement=auto", "trainer.max_staleness=3", "trainer.carry_surplus=2"],
            "trainer.carry_surplus=2 with placement=auto: its carry candidates run at "
            "max_staleness=2",
        ),
        (
            ["placement=disaggregated", "trainer.max_staleness=1", "trainer.carry_surplus=1"],
            "trainer.partial_rollout='finish' has none: drop trainer.carry_surplus",
        ),
    ],
)
def test_what_carry_does_not_support_is_refused_with_the_fix(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(compose_run(*overrides))
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["trainer.carry_segment=2"],
        ["trainer.max_staleness=3"],
        ["trainer.max_staleness=7", "trainer.carry_surplus=6", "trainer.carry_segment=1"],
        # the torch engine decodes the carried rows in segments for real
        ["simulate.response_length_median=0", "simulate.rollout_token_latency_ms=0"],
    ],
)
def test_carry_is_accepted_on_the_torch_engine_and_the_modelled_device(extra):
    run = load_config(compose_run(*CARRY, *extra))
    assert run.trainer.partial_rollout == "carry"
