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
