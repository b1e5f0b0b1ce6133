"""``tools.timeout_s`` times a tool call from when a pool thread takes it: a call queued behind
others is not charged their time, and a call past its timeout frees its thread."""

from __future__ import annotations

import threading
import time

import pytest

from rltrain.agents.interaction import LocalToolPool, ToolTimeout
from rltrain.config.schema import RunConfig
from rltrain.tasks.calc_tool import CalculatorEnv

RELEASE = threading.Event()  # ends the over-long call's sleep once the test is done


class SleepEnv(CalculatorEnv):
    """A tool that takes as many seconds as its action says (``"0.3"``); ``"stuck"`` runs until
    the test releases it."""

    def reset(self, example: object) -> str:
        return ""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if action == "stuck":
            RELEASE.wait(30)
        else:
            time.sleep(float(action))  # the tool's own running time, chosen by the test
        return "ok", 0.0, False, {}


def _pool(timeout_s: float) -> LocalToolPool:
    run = RunConfig()
    run.task.env = f"{__name__}:SleepEnv"
    run.tools.concurrency = 1  # one thread: every call but the first waits in the queue
    run.tools.timeout_s = timeout_s
    return LocalToolPool(run)


def test_queued_calls_are_timed_from_their_start():
    pool = _pool(timeout_s=0.5)
    ((env, _),) = pool.open([None])
    # three 0.3 s calls on one thread: the third waits 0.6 s (> 0.5) but runs 0.3 s (< 0.5)
    futures = [pool.step(env, "0.3", 1) for _ in range(3)]
    assert [f.result(timeout=10).observation for f in futures] == ["ok", "ok", "ok"]


def test_a_call_past_its_timeout_fails_and_frees_its_thread():
    pool = _pool(timeout_s=0.5)
    ((env, _),) = pool.open([None])
    try:
        stuck = pool.step(env, "stuck", 1)
        after = pool.step(env, "0.1", 2)  # queued behind the stuck call
        with pytest.raises(ToolTimeout, match="tools.timeout_s=0.5"):
            stuck.result(timeout=10)
        # the thread was free at the stuck call's timeout (the stuck call itself would hold it
        # until RELEASE): the queued call ran its 0.1 s and answered
        assert after.result(timeout=10).observation == "ok"
    finally:
        RELEASE.set()
