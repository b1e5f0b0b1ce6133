"""placement.auto.* is read only by placement=auto (and its pipeline stages only by embodied
runs): set elsewhere, each key is refused before Ray, naming it."""

from __future__ import annotations

import pytest
from composed import composed_run

from rltrain.errors import ConfigError


@pytest.mark.parametrize(
    "override",
    [
        "placement.auto.profile_steps=9",
        "placement.auto.time_limit_s=1",
        "placement.auto.reprofile=true",
        "placement.auto.max_checked=1",
    ],
)
def test_auto_keys_without_placement_auto_are_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}=.* nothing reads it: .*placement=auto"):
        composed_run("placement=collocated", override)


def test_pipeline_stages_are_refused_on_the_reasoning_runner_only():
    with pytest.raises(ConfigError, match=r"placement.auto.pipeline_stages=\[2\] is set but"):
        composed_run("placement=auto", "placement.auto.pipeline_stages=[2]")
    composed_run("placement=auto", "placement.auto.profile_steps=3")
    composed_run(
        "experiment=cartpole_hybrid", "placement.mode=auto", "placement.auto.pipeline_stages=[2]"
    )
