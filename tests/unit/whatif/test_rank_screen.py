"""``mode=plan``'s ranking excludes a candidate that training would refuse before Ray starts,
with the refusal, as ``placement=auto`` excludes it: an environment's episodes are not
continued across weight swaps, so a ``task.env`` run ranks no ``continue`` candidate."""

from __future__ import annotations

import dataclasses

from composed import composed_run

from rltrain.placement.types import ClusterSpec
from rltrain.runners.layout import decide_for_user
from rltrain.runners.plan_command import _planned_run, _refused
from rltrain.whatif import report
from rltrain.whatif.calibrate import DEFAULT

CALC_TOOL = ("experiment=calc_tool", "trainer.partial_rollout=finish", "mode=plan")


def _rows(run, screen):
    # as mode=plan ranks: the model the task's generator builds when its checkpoint is not there
    planned, _ = _planned_run(decide_for_user(run)[0])
    unsized = dataclasses.replace(run, model=planned.model)
    cluster = ClusterSpec.from_config(planned.cluster)
    rows = report.rank(planned, cluster, lambda r, p: True, DEFAULT, unsized, screen)
    return {r.name: r for r in rows}


def test_a_task_env_run_ranks_no_continue_candidate():
    run = composed_run(*CALC_TOOL)
    assert run.task.env is not None
    screened = _rows(run, _refused)
    cont = [r for name, r in screened.items() if name.endswith("continue")]
    assert cont, "the ranking offers a continue candidate to exclude"
    for row in cont:
        assert row.status == "excluded" and row.step_s is None
        assert "episodes are not continued across weight swaps" in row.reason
    # the other candidates are ranked as before; unscreened, continue would be ranked too
    assert all(r.status == "ok" for n, r in screened.items() if not n.endswith("continue"))
    unscreened = _rows(run, None)
    assert all(unscreened[r.name].status == "ok" for r in cont)


def test_a_run_without_an_environment_keeps_its_continue_candidates():
    rows = _rows(composed_run("mode=plan"), _refused)
    cont = [r for name, r in rows.items() if name.endswith("continue")]
    assert cont and all(r.status == "ok" for r in cont)
