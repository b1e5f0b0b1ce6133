"""How an episode's environment and last turn end: a reset that outlives ``tools.timeout_s`` still
closes its environment once it returns, and a last turn ending in ``]`` is scored unless it is a
tool call."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest
import torch

from rltrain.agents.interaction import (
    Episode,
    EpisodeSettings,
    LocalToolPool,
    ToolEpisodes,
    ToolReset,
    ToolTimeout,
    _close_quietly,
    timed_reset,
)
from rltrain.config.schema import RunConfig
from rltrain.tasks.base import Example
from rltrain.tasks.calc_tool import ALPHABET, CalculatorEnv
from rltrain.tasks.tokenizer import build_char_tokenizer
from rltrain.workers.tools import ToolWorker

WAIT_S = 10  # the longest any event here is waited for


class SlowResetEnv(CalculatorEnv):
    """A calculator whose reset waits for :attr:`go` (past any short timeout), then returns
    (or raises when :attr:`fail`); it records its ``close``."""

    fail = False
    close_raises = False
    made: list[SlowResetEnv] = []

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.returned = threading.Event()
        self.closed = threading.Event()
        SlowResetEnv.made.append(self)

    def reset(self, task: object) -> str:
        self.go.wait(WAIT_S)
        try:
            if self.fail:
                raise RuntimeError("the server refused the session")
            return super().reset(task)
        finally:
            self.returned.set()

    def close(self) -> None:
        self.closed.set()
        if self.close_raises:
            raise OSError("the session was already gone")


@pytest.fixture(autouse=True)
def fresh_envs():
    SlowResetEnv.made.clear()
    yield
    for env in SlowResetEnv.made:  # no reset thread outlives its test
        env.go.set()


def _settings(timeout_s: float = 0.05) -> EpisodeSettings:
    return EpisodeSettings(
        max_turns=1, max_total_tokens=100, timeout_s=timeout_s, concurrency=1, slots=0
    )


def _late_reset(env: SlowResetEnv) -> None:
    """Time out ``env``'s reset, then let it return."""
    with pytest.raises(ToolTimeout, match="environment reset ran longer than tools.timeout_s"):
        timed_reset(env, Example("3+4=", "7"), _settings())
    assert not env.closed.is_set()  # still resetting: nothing to close yet
    env.go.set()
    assert env.returned.wait(WAIT_S)


def test_a_reset_that_returns_after_its_timeout_closes_its_environment():
    env = SlowResetEnv()
    _late_reset(env)
    assert env.closed.wait(WAIT_S)


def test_a_late_reset_that_raises_leaves_close_uncalled():
    env = SlowResetEnv()
    env.fail = True
    _late_reset(env)
    assert not env.closed.wait(0.2)  # bounded: the callback ran when the reset ended


def test_a_failing_close_after_a_late_reset_is_logged_not_raised(caplog):
    env = SlowResetEnv()
    env.close_raises = True
    with caplog.at_level(logging.WARNING, logger="rltrain.agents.interaction"):
        _close_quietly(env)  # what a late reset's thread runs
    assert env.closed.is_set()
    assert "SlowResetEnv.close() raised after a reset that outlived tools.timeout_s" in caplog.text


def _run(env: str, **over: object) -> RunConfig:
    run = RunConfig()
    run.task.env = env
    run.rollout.max_turns = 1
    run.tools.timeout_s = 0.05
    for key, value in over.items():
        section, name = key.split("__")
        setattr(getattr(run, section), name, value)
    return run


def test_both_pools_close_an_environment_whose_reset_timed_out():
    run = _run(f"{__name__}:SlowResetEnv")
    assert LocalToolPool(run).open([Example("3+4=", "7")]) == [(None, None)]
    worker = ToolWorker(run)  # the tool pool's actor class, called in-process
    with pytest.raises(ToolTimeout):
        worker.reset(ToolReset("client:0", Example("3+4=", "7")))
    assert worker.envs == {}  # no episode holds it: close() of the run never reaches it
    for env in SlowResetEnv.made:
        env.go.set()
        assert env.closed.wait(WAIT_S)
    assert len(SlowResetEnv.made) == 2


# ------------------------------------------------------------------------- the last turn
def _last_turn(text: str, answer: str) -> Episode:
    """End an episode's only allowed turn with ``text`` (sampled up to its closing ``]``) and
    collect what the environment gave back."""
    tok = build_char_tokenizer(ALPHABET)
    task = SimpleNamespace(train=[Example("3+4=", answer)], eval=[])
    run = _run("rltrain.tasks.calc_tool:CalculatorEnv", tools__timeout_s=5.0)
    episodes = ToolEpisodes(run, lambda: None, tok, torch.device("cpu"), [tok.eos_token_id], task)
    [(handle, first)] = episodes.pool.open(task.train)
    prompt = tok(first, add_special_tokens=False)["input_ids"]
    e = Episode(0, handle, prompt)
    tokens = tok(text, add_special_tokens=False)["input_ids"]
    episodes._end_turn(e, tokens, [0.0] * len(tokens), seed=1)
    if e.pending is not None:
        e.pending.result(timeout=WAIT_S)
        episodes._collect(e)
    return e


def test_a_last_turn_answer_ending_in_a_bracket_is_scored():
    e = _last_turn("[7]", answer="[7]")  # "[7]" names no tool: an answer (parse_call)
    assert (e.done, e.truncated, e.failed, e.reward, e.turns, e.calls) == (
        True,
        False,
        False,
        1.0,
        1,
        0,
    )


def test_a_tool_call_on_the_last_turn_is_not_run_and_truncates_the_episode():
    e = _last_turn("calculator[3+4]", answer="7")
    assert e.pending is None  # never sent to the environment
    assert (e.done, e.truncated, e.failed, e.reward, e.calls) == (True, True, False, 0.0, 0)
