"""``trainer.partial_rollout=carry`` with ``task.env`` is refused with a fix that a multi-turn
run accepts: episodes are neither carried nor continued, so the fix is restart or finish."""

from __future__ import annotations

import pytest
from composed import composed as compose_run

from rltrain.config import load_config
from rltrain.errors import ConfigError


def test_carry_with_task_env_suggests_restart_or_finish_not_continue():
    overrides = (
        "experiment=calc_tool",
        "placement=disaggregated",
        "trainer.max_staleness=2",
        "trainer.partial_rollout=carry",
    )
    with pytest.raises(ConfigError) as err:
        load_config(compose_run(*overrides))
    line = next(p for p in str(err.value).splitlines() if "carry with task.env=" in p)
    assert line.endswith(
        "multi-turn episodes are not carried; set task.env=null or choose "
        "trainer.partial_rollout=restart or finish"
    )
