"""Tools placed in a run without task.env: the root problem (no task.env: remove the entry)
is what the run hears, not a tools.pool_size fix that leads to new refusals (no Ray)."""

from __future__ import annotations

from placement_helpers import compose

from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec
from rltrain.tasks.text_env import env_problems

TOOLS = {"placement.component_placement.tools": '{node_group: node, placement: "0"}'}


def test_tools_placed_without_task_env_are_refused_for_the_missing_env_only():
    run = compose("collocated", **TOOLS)
    assert run.task.env is None and run.tools.pool_size == 2
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    assert plan.tools is None  # no pool to size: tools.pool_size is no fix
    assert env_problems(run) == [
        "placement.component_placement places tools but the run has no task.env: a "
        "single-turn run has no tool pool. Remove the entry, or set task.env"
    ]
