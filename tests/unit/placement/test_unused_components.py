"""A placed component the runner has no worker for is refused before Ray (no Ray)."""

from __future__ import annotations

import dataclasses

import pytest
from placement_helpers import compose

from rltrain.errors import ConfigError
from rltrain.kinds import registry
from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec
from rltrain.runners.layout import check_components


def placed(**overrides):
    run = compose("collocated", **overrides)
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    return run, set(plan.components)


def test_env_in_a_reasoning_run_is_refused_with_the_key_to_remove():
    run, components = placed(**{"placement.component_placement.env": "all"})
    with pytest.raises(ConfigError) as info:
        check_components(run, components)
    text = str(info.value)
    assert "places ['env'], which runner=reasoning does not use" in text
    assert "remove placement.component_placement.env" in text


def test_the_check_asks_the_registry_not_a_list_of_names():
    # A component registered without a reasoning worker is refused like env ...
    judge = dataclasses.replace(registry.component("env"), name="judge", summary="a toy judge")
    with registry.registered(judge):
        run, components = placed(**{"placement.component_placement.judge": "all"})
        with pytest.raises(ConfigError, match=r"places \['judge'\].*judge: a toy judge"):
            check_components(run, components)
    # ... and the shipped reasoning placement passes.
    check_components(*placed())
