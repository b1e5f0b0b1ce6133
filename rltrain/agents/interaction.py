"""How a rollout runs: one seam for single-turn responses and multi-turn episodes with tools.

Both generation paths (the rollout worker and the fused worker) hold an :class:`Interaction`
and call ``generate`` / ``evaluate`` on it:

- :class:`SingleTurn`: one response per sample, as the engine returns it (no environment).
- :class:`ToolEpisodes` (``task.env`` set): each sample is an episode of a text environment
  (:mod:`rltrain.tasks.text_env`). A turn is sampled until EOS or a tool call's closing ``]``; the
  call runs on the tool pool (threads, ``tools.concurrency``) and its result is tokenised
  once and appended to the trajectory with loss mask 0. The trajectory is the exact token ids
  the engine sampled plus those observation ids: generated text is never re-tokenised.

While one part of the batch waits on its tools, the next part generates (``tools.interleave``
parts take turns; each part's turn is seeded by ``(seed, round, part)``, so a run is
reproducible whatever the tools' timing). A tool that raises (other than
:class:`~rltrain.tasks.text_env.ToolError`) or outlives ``tools.timeout_s`` marks its episode
infra-failed: loss mask 0 throughout, left out of the group statistics, counted in
``rollout/infra_failed``. ``rollout.max_turns`` and ``rollout.max_total_tokens`` end episodes
cleanly (``truncated``).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import SamplingParams, generate
from rltrain.config import seeds
from rltrain.errors import WorkerError
from rltrain.tasks.text_env import load_env_class
from rltrain.tasks.tokenizer import prompt_token_ids
from rltrain.tasks.tool_format import CALL_END

#: ``(prompts, seed, with_logprobs, should_stop) -> batch``: one engine call.
SampleFn = Callable[[Sequence[str], int, bool, Callable[[], bool] | None], RolloutBatch]


class Interaction(Protocol):
    """What a generation path asks of a rollout procedure."""

    def generate(
        self,
        prompts: Sequence[str],
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> RolloutBatch:
        """``n`` samples (episodes) per prompt as one batch, on CPU."""

    def evaluate(self, task: Any) -> float:
        """Greedy accuracy on the task's evaluation rows."""


@dataclass(frozen=True)
class SingleTurn:
    """One response per sample: the engine's call as it is.

    Attributes:
        sample: the engine's sampling call.
        greedy: the engine's greedy evaluation.
    """

    sample: SampleFn
    greedy: Callable[[Any], float]

    def generate(
        self,
        prompts: Sequence[str],
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> RolloutBatch:
        return self.sample(prompts, seed, with_logprobs, should_stop)

    def evaluate(self, task: Any) -> float:
        return self.greedy(task)


def call_end_ids(tokenizer: Any) -> frozenset[int]:
    """Every token whose text holds the call's end (``]``): each ends a turn as a call.

    A character tokenizer has one; a BPE vocabulary also merges ``]`` with what often follows
    it (``])``, ``].``, ``]]``), and a model that samples such a token has closed its call all
    the same: stopping only at the lone ``]`` would let the turn run on to its budget.

    Args:
        tokenizer: a Hugging Face tokenizer.

    Returns:
        The token ids.

    Raises:
        WorkerError: no token of the vocabulary can write the call's end.
    """
    vocab = tokenizer.get_vocab()
    special = set(getattr(tokenizer, "all_special_ids", ()))
    ids = [i for i in vocab.values() if i not in special]
    texts = tokenizer.batch_decode([[i] for i in ids])
    out = frozenset(i for i, t in zip(ids, texts, strict=True) if CALL_END in t)
    if not out:
        raise WorkerError(f"no token of the tokenizer writes the tool call's end {CALL_END!r}")
    return out


@dataclass(frozen=True)
class EpisodeSettings:
    """The keys a multi-turn rollout reads (``rollout.*``, ``tools.*``, ``simulate.*``)."""

    max_turns: int
    max_total_tokens: int
    timeout_s: float
    concurrency: int
    interleave: int
    tool_latency_s: float = 0.0
    tool_failure_rate: float = 0.0

    @classmethod
    def from_run(cls, run: Any) -> EpisodeSettings:
        r = run.rollout
        total = r.max_total_tokens or r.max_turns * r.max_new_tokens + 10**6
        return cls(
            max_turns=r.max_turns,
            max_total_tokens=total,
            timeout_s=run.tools.timeout_s,
            concurrency=run.tools.concurrency,
            interleave=run.tools.interleave,
            tool_latency_s=run.simulate.tool_latency_ms / 1000,
            tool_failure_rate=run.simulate.tool_failure_rate,
        )


class InjectedToolFailure(RuntimeError):
    """``simulate.tool_failure_rate``'s failure of one tool call."""


@dataclass
class Episode:
    """One sample's trajectory as it grows (response-side token lists, aligned)."""

    row: int
    env: Any
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    turns: int = 0
    calls: int = 0
    requests: int = 0
    reward: float = 0.0
    done: bool = False
    failed: bool = False
    truncated: bool = False
    pending: Future | None = None
    started: float = 0.0
    calling: bool = False

    def append(self, ids: Sequence[int], loss: float, logp: Sequence[float]) -> None:
        self.ids += list(ids)
        self.loss += [loss] * len(ids)
        self.logp += list(logp)


class ToolEpisodes:
    """Multi-turn episodes of ``task.env`` sampled with the torch sampler.

    Args:
        run: the checked run config.
        model: returns the policy to sample with (the rollout's copy, or the fused actor's).
        tokenizer: the policy's tokenizer.
        device: where the model is.
        eos_ids: the ids that end an episode's final turn.
        task: the built task (its rows give each episode's ``reset`` argument).

    Raises:
        ConfigError: ``task.env`` does not load (see :func:`load_env_class`).
        WorkerError: the tokenizer cannot spell the tool call's closing character.
    """

    def __init__(
        self,
        run: Any,
        model: Callable[[], torch.nn.Module],
        tokenizer: Any,
        device: torch.device,
        eos_ids: Sequence[int],
        task: Any,
    ) -> None:
        self.env_class = load_env_class(run.task.env)
        self.settings = EpisodeSettings.from_run(run)
        self.params = SamplingParams.from_rollout(run.rollout)
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.call_ends = call_end_ids(tokenizer)
        self.rows = {ex.prompt: ex for ex in (*task.train, *task.eval)}
        self.pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="tool")
        self.seed = run.seed

    # ------------------------------------------------------------------------------ public
    def generate(
        self,
        prompts: Sequence[str],
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> RolloutBatch:
        """``rollout.n_samples_per_prompt`` episodes per prompt, as one batch (CPU)."""
        n = self.params.n
        episodes = self._start([p for p in prompts for _ in range(n)])
        self._run(episodes, dataclasses.replace(self.params, n=1), seed, with_logprobs, should_stop)
        return self._batch(episodes, n, with_logprobs)

    def evaluate(self, task: Any) -> float:
        """Share of the evaluation rows whose greedy episode earns the full reward (episodes
        that failed for infrastructure reasons are left out)."""
        rows = list(task.eval)
        if not rows:
            return 0.0
        episodes = self._start([ex.prompt for ex in rows])
        greedy = dataclasses.replace(self.params, n=1, greedy=True)
        self._run(episodes, greedy, 0, False, None)
        scored = [e for e in episodes if not e.failed]
        return sum(e.reward >= 1.0 for e in scored) / max(len(scored), 1)

    # --------------------------------------------------------------------------- episodes
    def _start(self, prompts: Sequence[str]) -> list[Episode]:
        episodes = []
        for row, prompt in enumerate(prompts):
            example = self.rows.get(prompt)
            if example is None:
                raise WorkerError(f"prompt {prompt!r} is not a row of the task: no env to reset")
            env = self.env_class()
            first = env.reset(example)
            (ids,) = prompt_token_ids(self.tokenizer, [first])
            episodes.append(Episode(row, env, list(ids)))
        return episodes

    def _run(
        self,
        episodes: list[Episode],
        params: SamplingParams,
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        k = max(1, min(self.settings.interleave, len(episodes)))
        parts = [episodes[i::k] for i in range(k)]
        try:
            for round_ in range(self.settings.max_turns):
                for index, part in enumerate(parts):
                    for e in part:
                        self._collect(e)
                    live = [e for e in part if not e.done]
                    if live:
                        turn = seeds.turn_seed(seed, round_, index)
                        self._turn(live, params, turn, with_logprobs, should_stop)
            for e in episodes:
                self._collect(e)
        finally:
            for e in episodes:
                e.env.close()

    def _remaining(self, e: Episode) -> int:
        return self.settings.max_total_tokens - len(e.ids)

    def _turn(
        self,
        live: list[Episode],
        params: SamplingParams,
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        """Sample one turn of every live episode of a part, then hand its action to its env."""
        budget = min(params.max_new_tokens, max(self._remaining(e) for e in live))
        ids, mask = _left_padded([e.prompt + e.ids for e in live], self.tokenizer.pad_token_id)
        batch = generate(
            self.model(),
            ids.to(self.device),
            mask.to(self.device),
            dataclasses.replace(params, max_new_tokens=budget),
            {*self.eos_ids, *self.call_ends},
            self.tokenizer.pad_token_id,
            torch.Generator(device=self.device).manual_seed(seed),
            with_logprobs=with_logprobs,
            should_stop=should_stop,
        ).to("cpu")
        for i, e in enumerate(live):
            length = min(int(batch.response_mask[i].sum()), self._remaining(e))
            tokens = batch.response_ids[i, :length].tolist()
            logp = batch.old_logprobs[i, :length].tolist() if with_logprobs else [0.0] * length
            e.append(tokens, 1.0, logp)
            e.turns += 1
            last = tokens[-1] if tokens else None
            if last in self.eos_ids:
                self._submit(e, self.tokenizer.decode(tokens[:-1]), calling=False)
            elif last in self.call_ends and self._remaining(e) > 0:
                text = self.tokenizer.decode(tokens)  # a merged "])" keeps its tail in the ids
                self._submit(e, text[: text.rindex(CALL_END) + 1], calling=True)
            else:  # the token budget cut the turn
                e.done = e.truncated = True

    def _submit(self, e: Episode, action: str, calling: bool) -> None:
        rng = None
        if calling:  # failures are drawn per (run seed, row, call): timing never changes them
            e.requests += 1
            rng = random.Random(seeds.tool_failure_seed(self.seed, e.row, e.requests))
        e.started, e.calling = time.monotonic(), calling
        e.pending = self.pool.submit(self._step, e.env, action, rng)

    def _step(self, env: Any, action: str, rng: random.Random | None) -> Any:
        s = self.settings
        if rng is not None:  # a tool call: the modelled latency and injected failures
            if s.tool_latency_s:
                time.sleep(s.tool_latency_s)
            if s.tool_failure_rate and rng.random() < s.tool_failure_rate:
                raise InjectedToolFailure("simulate.tool_failure_rate")
        return env.step(action)

    def _collect(self, e: Episode) -> None:
        """Take an episode's pending step: its observation, reward and end."""
        if e.pending is None:
            return
        future, e.pending = e.pending, None
        left = self.settings.timeout_s - (time.monotonic() - e.started)
        try:
            observation, reward, done, info = future.result(timeout=max(left, 0.0))
        except Exception as exc:  # raised or timed out: the episode's failure, not the run's
            if isinstance(exc, FutureTimeout):
                future.cancel()  # a call already running cannot be stopped: its thread is left
            e.calls += int(e.calling)
            e.done = e.failed = True
            return
        if "tool" in info:  # the env ran a tool (a turn ending in "]" may still be an answer)
            e.calls += 1
        if observation and not done:
            ids = self.tokenizer(observation, add_special_tokens=False)["input_ids"]
            ids = ids[: max(self._remaining(e), 0)]
            e.append(ids, 0.0, [0.0] * len(ids))
        e.reward = float(reward)
        if done:
            e.done = True
        elif e.turns >= self.settings.max_turns or self._remaining(e) <= 0:
            e.done = e.truncated = True

    # ------------------------------------------------------------------------------ batch
    def _batch(self, episodes: list[Episode], n: int, with_logprobs: bool) -> RolloutBatch:
        pad = self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = _left_padded([e.prompt for e in episodes], pad)
        width = max(1, max(len(e.ids) for e in episodes))
        b = len(episodes)
        ids = torch.full((b, width), pad, dtype=torch.long)
        mask = torch.zeros((b, width))
        loss = torch.zeros((b, width))
        logp = torch.zeros((b, width))
        for i, e in enumerate(episodes):
            k = len(e.ids)
            ids[i, :k] = torch.tensor(e.ids, dtype=torch.long)
            mask[i, :k] = 1.0
            if not e.failed:
                loss[i, :k] = torch.tensor(e.loss)
            logp[i, :k] = torch.tensor(e.logp)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=ids,
            response_mask=mask,
            group_size=n,
            old_logprobs=logp if with_logprobs else None,
            truncated=torch.tensor([e.truncated for e in episodes]),
            loss_mask=loss,
            env_rewards=torch.tensor([e.reward for e in episodes]),
            infra_failed=torch.tensor([e.failed for e in episodes]),
            turns=torch.tensor([e.turns for e in episodes]),
            tool_calls=torch.tensor([e.calls for e in episodes]),
        )


def _left_padded(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[b, L]`` ids padded on the left and their mask."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


def engine_interaction(run: Any, engine: Any) -> Interaction:
    """The rollout worker's interaction over its generation engine.

    Args:
        run: the checked run config.
        engine: the :class:`~rltrain.backends.generation.GenerationEngine` (the torch engine's
            ``model``, ``tokenizer`` and ``eos_ids`` when ``task.env`` is set).

    Returns:
        :class:`SingleTurn` over the engine's calls, or :class:`ToolEpisodes` with ``task.env``.
    """
    if run.task.env is None:
        return SingleTurn(engine.generate, engine.evaluate)
    return tool_episodes(run, lambda: engine.model, engine.tokenizer, engine.device, engine.eos_ids)


def tool_episodes(
    run: Any,
    model: Callable[[], torch.nn.Module],
    tokenizer: Any,
    device: torch.device,
    eos_ids: Sequence[int],
) -> ToolEpisodes:
    """:class:`ToolEpisodes` for ``task.env``, its task built as the workers build it."""
    from rltrain.tasks import build_task

    task = build_task(run.task, tokenizer)
    return ToolEpisodes(run, model, tokenizer, device, eos_ids, task)
