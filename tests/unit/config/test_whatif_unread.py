"""``whatif.*`` keys refused where nothing would read them: the sigma of a length model that is
not log-normal, a link between nodes on one node, and any whatif key in a training run of a
layout chosen by hand (only mode=plan and placement=auto read the section)."""

from __future__ import annotations

import pytest
from composed import composed as compose_run

from rltrain.config import load_config
from rltrain.errors import ConfigError


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["mode=plan", "whatif.response_length_sigma=1.5"],
            "whatif.response_length_sigma=1.5 only shapes whatif.response_length=lognormal (it "
            "is 'max'): set that, or drop the sigma (default 0.8)",
        ),
        (
            ["mode=plan", "whatif.hardware=h100", "whatif.link=roce"],
            "whatif.link='roce' is the link between nodes, and cluster.num_nodes=1 has one",
        ),
        (
            ["whatif.hardware=h100"],
            "whatif.hardware='h100' is read only by mode=plan and placement=auto, and this is a "
            "training run of placement=collocated: run python -m rltrain mode=plan with the "
            "same keys to predict it, use placement=auto to let the simulator rank layouts, or "
            "drop whatif.hardware",
        ),
        (["placement=disaggregated", "whatif.steps=5"], "drop whatif.steps"),
    ],
)
def test_an_unread_whatif_key_is_refused_with_the_fix(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(compose_run(*overrides))
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["mode=plan", "whatif.response_length=lognormal", "whatif.response_length_sigma=1.5"],
        [
            "mode=plan",
            "cluster=ray",
            "cluster.num_nodes=2",
            "whatif.hardware=h100",
            "whatif.link=roce",
        ],
        ["mode=plan", "whatif.steps=5", "whatif.rank_candidates=false"],
        ["placement=auto", "whatif.calibrate=false"],
        # a training run at the defaults: presets leave whatif alone
        [],
    ],
)
def test_whatif_keys_that_something_reads_are_accepted(overrides):
    load_config(compose_run(*overrides))
