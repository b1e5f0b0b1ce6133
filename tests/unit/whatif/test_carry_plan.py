"""``mode=plan`` refuses ``trainer.partial_rollout=carry`` (the simulator does not model rows
carried across calls) before writing anything, naming the fix."""

from __future__ import annotations

import pytest

from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.runners.plan_command import plan_command
from rltrain.whatif.events import unmodelled


def test_plan_refuses_carry_before_writing(tmp_path):
    run = RunConfig()
    run.trainer.max_staleness = 2
    run.trainer.partial_rollout = "carry"
    with pytest.raises(ConfigError) as err:
        plan_command(run, str(tmp_path / "plan"))
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith("trainer.partial_rollout='carry'")
    assert "plan with trainer.partial_rollout=continue" in err.value.problems[0]
    assert not (tmp_path / "plan").exists()
    run.trainer.partial_rollout = "continue"
    assert unmodelled(run) == []  # continue is modelled
