"""placement.auto.* read with defaults and checked with every problem named."""

from __future__ import annotations

import dataclasses
import os

import pytest

from rltrain.autoplace.settings import AutoSettings, check_auto
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError


def _run(**auto):
    run = RunConfig()
    section = dataclasses.replace(run.placement.auto, **auto)
    return dataclasses.replace(run, placement=dataclasses.replace(run.placement, auto=section))


def test_defaults_are_usable():
    assert check_auto(RunConfig()) == []
    s = AutoSettings.from_run(RunConfig())
    assert s.candidates == ("collocated", "disaggregated", "hybrid") and s.staleness == (0, 1)
    assert s.cache_path == os.path.expanduser("~/.cache/rltrain/profiles")


def test_values_are_read():
    s = AutoSettings.from_run(
        _run(profile_steps=6, cache_dir="/tmp/x", candidates=["hybrid"], staleness=[0])
    )
    assert (s.profile_steps, s.cache_path, s.candidates, s.staleness) == (
        6,
        "/tmp/x",
        ("hybrid",),
        (0,),
    )


def test_a_config_without_the_section_gets_defaults():
    class Bare:
        placement = object()

    assert AutoSettings._read(getattr(Bare.placement, "auto", None)) == AutoSettings()
    assert check_auto(Bare()) == []


def test_every_bad_value_is_named():
    bad = _run(
        profile_steps=1,
        time_limit_s=0,
        candidates=["fused"],
        staleness=[2],
        pipeline_stages=[0],
        max_checked=0,
    )
    problems = check_auto(bad)
    assert len(problems) == 6
    for key in (
        "profile_steps=1",
        "time_limit_s=0",
        "candidates=['fused']",
        "staleness=[2]",
        "pipeline_stages=[0]",
        "max_checked=0",
    ):
        assert any(f"placement.auto.{key}" in p for p in problems), key
    with pytest.raises(ConfigError) as err:
        AutoSettings.from_run(bad)
    assert len(err.value.problems) == 6


def test_partial_rollout_policies_follow_the_trainer_key():
    """Unset: finish and continue, unless trainer.partial_rollout chose restart/continue, which
    auto then keeps; a list is tried as given."""
    from rltrain.bench.measures.trainer import compose

    assert AutoSettings.from_run(compose("placement=auto")).partial_rollout == (
        "finish",
        "continue",
    )
    chosen = compose("placement=auto", "trainer.partial_rollout=restart")
    assert AutoSettings.from_run(chosen).partial_rollout == ("restart",)
    asked = compose("placement=auto", "placement.auto.partial_rollout=[restart,finish]")
    assert AutoSettings.from_run(asked).partial_rollout == ("restart", "finish")
    same = compose(
        "placement=auto",
        "trainer.partial_rollout=continue",
        "placement.auto.partial_rollout=[continue]",
    )
    assert AutoSettings.from_run(same).partial_rollout == ("continue",)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["placement.auto.partial_rollout=[finish,pause]"],
            "placement.auto.partial_rollout=['finish', 'pause']: give distinct values",
        ),
        (["placement.auto.partial_rollout=[]"], "placement.auto.partial_rollout=[]: give"),
        (
            [
                "placement=auto",
                "placement.auto.staleness=[0]",
                "placement.auto.partial_rollout=[continue]",
            ],
            "no candidate runs asynchronously",
        ),
        (
            [
                "placement=auto",
                "trainer.partial_rollout=restart",
                "placement.auto.partial_rollout=[finish,continue]",
            ],
            "the trainer key fixes the policy",
        ),
    ],
)
def test_a_partial_rollout_list_that_would_do_nothing_is_refused(overrides, expected):
    from rltrain.bench.measures.trainer import compose

    with pytest.raises(ConfigError) as err:
        compose(*overrides)
    assert expected in str(err.value)
