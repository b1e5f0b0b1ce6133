"""Multi-turn episodes with the torch engine: token-exact trajectories (the rollout/trainer
log-prob gap over a multi-turn batch), masks, limits, and tool faults that cost nothing."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from concurrent.futures import Future

import pytest
import torch
from calc_agents import env_run, episodes, supervised_agent

from rltrain.agents.interaction import LocalToolPool, ToolEpisodes, run_step
from rltrain.algorithms.update import UpdateSettings, add_advantages, ppo_update
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, WorkerError
from rltrain.tasks.calc_tool import CalculatorEnv
from rltrain.tasks.text_env import env_problems, load_env_class, tools_of
from rltrain.tasks.tool_format import parse_call

RELEASE = threading.Event()  # frees the stuck tool's thread once the test is done


class StuckEnv(CalculatorEnv):
    """A calculator whose tool calls (of any name) never answer in time."""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if parse_call(action) is not None:
            RELEASE.wait(30)
        return super().step(action)


@pytest.fixture(scope="module")
def agent():
    """A tiny model briefly supervised on 2-term, 1-digit tool-call demonstrations (it calls
    the tool, so episodes take several turns), its tokenizer and task."""
    return supervised_agent(num_train=60, num_eval=8)


_run, _episodes = env_run, episodes


def test_a_multi_turn_batch_is_token_exact_and_masks_the_tool_results(agent):
    model, tok, task = agent
    batch = _episodes(agent, _run()).generate([ex.prompt for ex in task.train[:6]], 7, True, None)
    assert int(batch.tool_calls.sum()) > 0 and int(batch.turns.max()) >= 2
    equals = tok.convert_tokens_to_ids("=")
    for i in range(batch.size):
        n = int(batch.response_mask[i].sum())
        ids, loss = batch.response_ids[i, :n].tolist(), batch.loss_mask[i, :n].tolist()
        # every tool result "=...;" is in the response, attended to, and not trained on
        runs = [j for j in range(n) if loss[j] == 0 and (j == 0 or loss[j - 1] == 1)]
        assert len(runs) == int(batch.tool_calls[i])
        assert all(ids[j] == equals for j in runs)
    s = UpdateSettings(old_logprobs="recompute")
    scored = add_advantages(batch.replace(rewards=batch.env_rewards), s).replace(
        rollout_logprobs=batch.old_logprobs, old_logprobs=None
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    metrics = ppo_update(model, optimizer, scored, s)
    assert metrics["rollout/logprob_gap_max"] <= 1e-5
    assert metrics["rollout/logprob_gap_tokens"] == float(batch.loss_mask.sum())


def test_injected_tool_failures_mark_episodes_infra_failed(agent):
    _, _, task = agent
    run = _run(simulate__tool_failure_rate=0.5)
    batch = _episodes(agent, run).generate([ex.prompt for ex in task.train[:6]], 3, True, None)
    failed = batch.infra_failed
    assert 0 < int(failed.sum()) < batch.size
    assert float(batch.loss_mask[failed].sum()) == 0.0  # out of the loss, not scored 0
    adv = add_advantages(batch.replace(rewards=batch.env_rewards), UpdateSettings()).advantages
    assert float(adv[failed].abs().sum()) == 0.0


def test_a_tool_that_times_out_fails_its_episode_and_the_batch_goes_on(agent):
    _, _, task = agent
    run = _run(env=f"{__name__}:StuckEnv", tools__timeout_s=0.2, rollout__max_turns=2)
    try:
        batch = _episodes(agent, run).generate([task.train[0].prompt], 1, False, None)
    finally:
        RELEASE.set()
    called = batch.tool_calls > 0
    assert bool(called.any()) and bool(batch.infra_failed[called].all())


class LosingPool(LocalToolPool):
    """The in-process pool, except that the worker behind every tool call is gone: the call's
    future raises, and the pool then reports the loss (as RayToolPool does for a dead actor)."""

    def step(self, handle, action, failure_seed):
        if failure_seed is None:  # a final answer
            return super().step(handle, action, failure_seed)
        self.lost = True
        future: Future = Future()
        future.set_exception(RuntimeError("the tool worker died"))
        return future

    def check(self) -> None:
        if getattr(self, "lost", False):
            raise WorkerError("tool worker(s) [0] of the tool pool died")


def test_a_lost_tool_worker_fails_its_episodes_then_stops_the_batch(agent):
    model, tok, task = agent
    run = _run()
    pool = LosingPool(run)
    episodes = ToolEpisodes(
        run, lambda: model, tok, torch.device("cpu"), [tok.eos_token_id], task, pool
    )
    failed: list = []
    collect = episodes._collect
    episodes._collect = lambda e: (collect(e), failed.append(e.failed))[0]
    with pytest.raises(WorkerError, match="of the tool pool died"):
        episodes.generate([ex.prompt for ex in task.train[:4]], 7, False, None)
    assert any(failed)  # the episodes that called the lost worker were failed first


def test_limits_end_episodes_cleanly(agent):
    _, _, task = agent
    run = _run(rollout__max_turns=1, rollout__max_total_tokens=5)
    batch = _episodes(agent, run).generate([task.train[0].prompt], 2, False, None)
    lengths = batch.response_mask.sum(dim=1)
    assert int(lengths.max()) <= 5 and int(batch.turns.max()) == 1
    # an episode ends by its own action (EOS, or a "]" its env answered with done), or its
    # limits cut it: then it is truncated
    _, tok, _ = agent
    own = {tok.eos_token_id, tok.convert_tokens_to_ids("]")}
    last = [int(batch.response_ids[i, int(lengths[i]) - 1]) for i in range(batch.size)]
    assert bool(batch.truncated.any())
    assert all(bool(t) or x in own for t, x in zip(batch.truncated, last, strict=True))


def test_task_env_is_checked_before_ray():
    assert tools_of(CalculatorEnv()).keys() == {"calculator"}
    with pytest.raises(ConfigError, match="task.env='nope.module:X' could not be imported"):
        load_env_class("nope.module:X")
    with pytest.raises(ConfigError, match="lacks"):
        load_env_class("rltrain.tasks.base:Example")
    run = _run(rollout__backend="vllm")
    assert any("rollout.backend='vllm'" in p for p in env_problems(run))
    scored = _run()
    scored.task.reward_fn = "rltrain.rewards.math:gsm8k"  # the env scores: it would be ignored
    assert any(
        "task.reward_fn='rltrain.rewards.math:gsm8k' is not read" in p for p in env_problems(scored)
    )
    plain = RunConfig()
    plain.rollout.max_turns = 2
    assert env_problems(plain) == ["rollout.max_turns=2 needs task.env (an environment)"]


class SlowFirstCallPool(LocalToolPool):
    """The first tool call answers only once another episode has sent a later action, i.e.
    decoded a turn after its own tool's reply (or, failing that, after 20 s)."""

    def __init__(self, run):
        super().__init__(run)
        self.sent: dict[int, int] = {}
        self.slow: int | None = None
        self.later = threading.Event()
        self.order: list[str] = []

    def step(self, handle, action, failure_seed):
        sent = self.sent[id(handle)] = self.sent.get(id(handle), 0) + 1
        if self.slow is None and failure_seed is not None:
            self.slow = id(handle)
            future: Future = Future()

            def answer() -> None:
                self.later.wait(20)
                self.order.append("slow reply")
                future.set_result(run_step(handle, action, failure_seed, self.settings))

            threading.Thread(target=answer, daemon=True).start()
            return future
        if self.slow is not None and id(handle) != self.slow and sent >= 2:
            if not self.later.is_set():
                self.order.append("another episode's next action")
            self.later.set()
        return super().step(handle, action, failure_seed)


def test_a_slow_tool_does_not_hold_the_other_episodes(agent):
    model, tok, task = agent
    run = _run(tools__timeout_s=5.0)  # a loop that waits for every call fails the slow one
    pool = SlowFirstCallPool(run)
    episodes = ToolEpisodes(
        run, lambda: model, tok, torch.device("cpu"), [tok.eos_token_id], task, pool
    )
    batch = episodes.generate([ex.prompt for ex in task.train[:2]], 5, False, None)
    assert pool.order == ["another episode's next action", "slow reply"]
    assert not bool(batch.infra_failed.any())  # the slow episode went on after its reply too
    assert int(batch.turns.max()) >= 2


class JitterPool(LocalToolPool):
    """Tool calls that each take a random 0-40 ms (the draws differ by ``seed``)."""

    def __init__(self, run, seed: int):
        super().__init__(run)
        self.rng = random.Random(seed)

    def step(self, handle, action, failure_seed):
        delay = self.rng.uniform(0.0, 0.04)

        def slow() -> object:
            time.sleep(delay)  # the modelled tool latency, not a wait for an event
            return run_step(handle, action, failure_seed, self.settings)

        return self.threads.submit(slow)


def test_the_same_seed_samples_the_same_tokens_whatever_the_tools_timing(agent):
    model, tok, task = agent
    prompts = [ex.prompt for ex in task.train[:3]]
    batches = []
    for slots, pool_seed in ((0, None), (3, 1), (5, 2)):
        run = _run(tools__slots=slots)
        pool = None if pool_seed is None else JitterPool(run, pool_seed)
        episodes = ToolEpisodes(
            run, lambda: model, tok, torch.device("cpu"), [tok.eos_token_id], task, pool
        )
        batches.append(episodes.generate(prompts, 9, True, None))
    first = batches[0]
    assert int(first.tool_calls.sum()) > 0
    for other in batches[1:]:
        assert torch.equal(other.response_ids, first.response_ids)
        assert torch.equal(other.loss_mask, first.loss_mask)
        assert torch.allclose(other.old_logprobs, first.old_logprobs, atol=1e-5)


def test_tool_latency_below_the_timeout_fails_no_episode_whatever_the_queue(agent):
    _, _, task = agent
    # one tool thread, every call 0.3 s: episodes that call at once queue for longer than
    # timeout_s, yet each call runs 0.3 s < 0.4 s
    run = _run(tools__concurrency=1, tools__timeout_s=0.4, simulate__tool_latency_ms=300)
    batch = _episodes(agent, run).generate([ex.prompt for ex in task.train[:2]], 4, False, None)
    assert int(batch.tool_calls.sum()) >= 3
    assert not bool(batch.infra_failed.any())


def test_tool_failures_are_drawn_per_call_seed(agent):
    _, _, task = agent
    episodes = _episodes(agent, _run(simulate__tool_failure_rate=0.3))
    greedy = dataclasses.replace(episodes.params, n=1, greedy=True)  # the same calls each time
    prompts = [ex.prompt for ex in task.train[:12]]

    def failed(seed: int) -> list[int]:
        runs = episodes._start(prompts)
        episodes._run(runs, greedy, seed, False, None)
        assert sum(e.requests for e in runs) >= 10
        return [e.row for e in runs if e.failed]

    first = failed(101)  # two steps' (or ranks', or evaluations') seeds
    assert first != failed(202)
    assert failed(101) == first  # reproducible
