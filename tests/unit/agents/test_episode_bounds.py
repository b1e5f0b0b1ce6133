"""What bounds a multi-turn episode: its task row, its last turn, the model's context, a reset
that hangs, and an evaluation with nothing scored."""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import pytest
import torch
from calc_agents import env_run, episodes, supervised_agent

from rltrain.agents.interaction import LocalToolPool, rows_by_prompt
from rltrain.algorithms.batch import RolloutBatch
from rltrain.config.schema import RunConfig
from rltrain.errors import WorkerError
from rltrain.tasks.base import Example
from rltrain.tasks.calc_tool import CalculatorEnv
from rltrain.workers.rollout import RolloutWorker, policy_tokens

RELEASE = threading.Event()  # frees the hung resets' threads once the test is done


class HangResetEnv(CalculatorEnv):
    """A calculator whose reset never answers in time on prompts starting with ``1``."""

    def reset(self, task: object) -> str:
        if str(task.prompt).startswith("1"):  # type: ignore[attr-defined]
            RELEASE.wait(30)
        return super().reset(task)


class LongResultEnv(CalculatorEnv):
    """A calculator whose results carry 40 more characters (a verbose tool)."""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        observation, reward, done, info = super().step(action)
        if observation:
            observation = observation[:-1] + "0" * 40 + ";"
        return observation, reward, done, info


class CountingPool(LocalToolPool):
    """The in-process pool, counting the tool calls it runs (steps with a failure seed)."""

    def __init__(self, run: RunConfig) -> None:
        super().__init__(run)
        self.calls = 0

    def step(self, handle, action, failure_seed):
        self.calls += failure_seed is not None
        return super().step(handle, action, failure_seed)


@pytest.fixture(scope="module")
def agent():
    """A tiny model briefly supervised to call the calculator on 2-term sums, its tokenizer
    and task."""
    return supervised_agent(num_train=40, num_eval=6)


_run, _episodes = env_run, episodes


def test_a_prompt_names_one_row_or_the_task_is_refused():
    same = SimpleNamespace(
        train=[Example("go", "a"), Example("go", "a")], eval=[Example("go", "a")]
    )
    assert rows_by_prompt(same) == {"go": Example("go", "a")}
    # a generic prompt with the problem id as the answer: the second row's episodes would
    # reset on the first row's problem
    dup = SimpleNamespace(train=[Example("go", "problem-A")], eval=[Example("go", "problem-B")])
    with pytest.raises(WorkerError, match="'problem-A' and 'problem-B'.*its own prompt"):
        rows_by_prompt(dup)


def test_a_call_on_the_last_turn_is_not_run_and_the_episode_is_scored(agent):
    _, _, task = agent
    # every call would fail: run at the last turn, it would infra-fail its episode
    run = _run(rollout__max_turns=1, simulate__tool_failure_rate=1.0)
    pool = CountingPool(run)
    batch = _episodes(agent, run, pool).generate(
        [ex.prompt for ex in task.train[:4]], 7, True, None
    )
    called = batch.truncated & (batch.turns == 1)
    assert bool(called.any())  # the supervised model calls the tool at its first turn
    assert pool.calls == 0 and int(batch.tool_calls.sum()) == 0
    assert not bool(batch.infra_failed.any())
    assert float(batch.env_rewards[called].sum()) == 0.0  # scored 0, in the group's statistics
    assert float(batch.loss_mask[called].sum()) == float(batch.response_mask[called].sum())


def test_an_episode_ends_at_the_models_context(agent):
    model, _, task = agent
    short = copy.deepcopy(model)
    short.config.max_position_embeddings = 24  # a prompt, a call and a long result overrun it
    run = _run(env=f"{__name__}:LongResultEnv")  # rollout.max_total_tokens=null
    prompts = [ex.prompt for ex in task.train[:4]]
    batch = _episodes(agent, run, model=short).generate(prompts, 7, True, None)
    lengths = batch.prompt_mask.sum(1) + batch.response_mask.sum(1)
    assert int(lengths.max()) == 24  # cut there, not beyond
    assert bool(batch.truncated[lengths == 24].all()) and not bool(batch.infra_failed.any())
    # the same episodes with the model's own context of 64 run past 24 tokens
    longer = _episodes(agent, run).generate(prompts, 7, True, None)
    assert int((longer.prompt_mask.sum(1) + longer.response_mask.sum(1)).max()) > 24


def test_a_reset_past_the_timeout_fails_its_episode_and_the_batch_goes_on(agent):
    _, _, task = agent
    hung = next(ex for ex in task.train if ex.prompt.startswith("1"))
    other = next(ex for ex in task.train if not ex.prompt.startswith("1"))
    run = _run(env=f"{__name__}:HangResetEnv", tools__timeout_s=0.2)
    try:
        batch = _episodes(agent, run).generate([hung.prompt, other.prompt], 1, False, None)
    finally:
        RELEASE.set()
    assert batch.infra_failed.tolist() == [True] * 4 + [False] * 4
    assert float(batch.loss_mask[:4].sum()) == 0.0 and batch.turns[:4].tolist() == [0] * 4
    assert int(batch.turns[4:].min()) >= 1


def test_an_evaluation_with_no_episode_scored_has_no_accuracy(agent):
    _, _, task = agent
    RELEASE.clear()
    evals = [ex for ex in task.train if ex.prompt.startswith("1")][:2]
    try:
        run = _run(env=f"{__name__}:HangResetEnv", tools__timeout_s=0.2)
        episodes = _episodes(agent, run)
        assert episodes.evaluate(SimpleNamespace(eval=evals), 0) is None
    finally:
        RELEASE.set()
    assert episodes.evaluate(SimpleNamespace(eval=[]), 0) is None
    assert 0.0 <= _episodes(agent, _run()).evaluate(task, 0) <= 1.0


def _batch(loss_mask: torch.Tensor | None) -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=torch.ones(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1, dtype=torch.long),
        response_ids=torch.ones(2, 5, dtype=torch.long),
        response_mask=torch.tensor([[1.0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
        loss_mask=loss_mask,
    )


def test_discarded_tokens_count_only_what_the_policy_sampled():
    # row 0: a call (2 tokens), its result (2), EOS; row 1: infra-failed (loss mask 0)
    multi = _batch(torch.tensor([[1.0, 0, 0, 1, 0], [0, 0, 0, 0, 0]]))
    assert policy_tokens(multi) == 2
    assert policy_tokens(_batch(None)) == 4 + 5  # single-turn: every response token
    worker = RolloutWorker.__new__(RolloutWorker)  # only its bookkeeping, no engine
    worker._discarded = {}
    worker._count_discarded(3, multi)
    assert worker._discarded == {3: 2}
