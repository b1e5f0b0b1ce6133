"""How a rollout runs: one seam for single-turn responses and multi-turn episodes with tools.

Both generation paths (the rollout worker and the fused worker) hold an :class:`Interaction`
and call ``generate`` / ``evaluate`` on it:

- :class:`SingleTurn`: one response per sample, as the engine returns it (no environment).
- :class:`ToolEpisodes` (``task.env`` set): each sample is an episode of a text environment
  (:mod:`rltrain.tasks.text_env`). A turn is sampled until EOS or a tool call's closing ``]``; the
  action goes to the :class:`ToolPool` that hosts the episode's environment and its result is
  tokenised once and appended to the trajectory with loss mask 0. The trajectory is the exact
  token ids the engine sampled plus those observation ids: generated text is never re-tokenised.

Where the environments live is the pool's business: in a run, the ``tools`` component's Ray
actors (:class:`rltrain.workers.tools.ToolWorker`, placed and sized by the plan); in tests and
the in-process benchmark, :class:`LocalToolPool` (threads of this process).

Turns are decoded by continuous batching (:class:`~rltrain.agents.decoding.TurnDecoder`): an
episode leaves the decoding batch when its turn ends, the others keep decoding while its tool
runs, and it joins again at the next step once the reply arrived (``tools.slots`` caps the rows
decoded at once). Each turn samples with its own generator seeded by ``(seed, episode, turn)``,
so a run is reproducible whatever the tools' timing. A tool that raises (other than
:class:`~rltrain.tasks.text_env.ToolError`) or runs longer than ``tools.timeout_s`` marks its
episode infra-failed: loss mask 0 throughout, left out of the group statistics, counted in
``rollout/infra_failed``. The timeout is measured where the call runs, from when a pool thread
takes it (:func:`timed_step`), so a call queued behind others is not charged their time.
``rollout.max_turns``, ``rollout.max_total_tokens`` and the model's context
(``max_position_embeddings``: prompt, turns and tool results together) end episodes cleanly
(``truncated``); a turn that calls a tool with no turn left after it ends the episode there, the
call not run. An environment whose ``reset`` outlives ``tools.timeout_s`` fails its episode too
(and is closed when that reset returns after all).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rltrain.agents.decoding import TurnDecoder, TurnRequest
from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import GenerationStopped, SamplingParams, left_padded
from rltrain.config import seeds
from rltrain.errors import WorkerError
from rltrain.tasks.text_env import load_env_class
from rltrain.tasks.tokenizer import prompt_token_ids
from rltrain.tasks.tool_format import CALL_END, parse_call

log = logging.getLogger(__name__)

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

    def evaluate(self, task: Any, seed: int = 0) -> float | None:
        """Greedy accuracy on the task's evaluation rows (``seed``: the evaluation's own, for
        what it draws besides its greedy tokens); None when no evaluation episode was scored
        (every one infra-failed)."""


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

    def evaluate(self, task: Any, seed: int = 0) -> float | None:
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
    slots: int
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
            slots=run.tools.slots,
            tool_latency_s=run.simulate.tool_latency_ms / 1000,
            tool_failure_rate=run.simulate.tool_failure_rate,
        )


class InjectedToolFailure(RuntimeError):
    """``simulate.tool_failure_rate``'s failure of one tool call."""


class EpisodesStopped(GenerationStopped):
    """A multi-turn batch cancelled mid-way (a weight swap). Episodes are never paused (their
    tools' state cannot be continued under new weights): there is no partial batch, and the
    episodes' sampled tokens are thrown away.

    Args:
        sampled_tokens: the tokens the engine had sampled for the batch (tool observations not
            counted), turns still decoding included.
    """

    def __init__(self, sampled_tokens: int) -> None:
        super().__init__(None)
        self.sampled_tokens = sampled_tokens


class ToolTimeout(RuntimeError):
    """A tool call ran longer than ``tools.timeout_s``."""


# ------------------------------------------------------------------------------ tool messages
@dataclass(frozen=True)
class ToolReset:
    """Start one episode's environment on a tool worker.

    Attributes:
        key: the episode's key, unique over every process sending to the pool.
        example: the task row ``reset`` receives.
    """

    key: str
    example: Any


@dataclass(frozen=True)
class ToolStep:
    """One action of an episode, run by the worker hosting its environment.

    Attributes:
        key: the episode's key (its :class:`ToolReset`'s).
        action: the model's turn as text.
        failure_seed: for a tool call, the seed ``simulate.tool_failure_rate`` and
            ``simulate.tool_latency_ms`` apply with; None for a final answer (never failed).
    """

    key: str
    action: str
    failure_seed: int | None


@dataclass(frozen=True)
class ToolReply:
    """What an environment's ``step`` returned."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any]


def run_step(env: Any, action: str, failure_seed: int | None, s: EpisodeSettings) -> ToolReply:
    """One ``env.step``, with the modelled latency and injected failures of a tool call.

    Raises:
        InjectedToolFailure: the call drew ``simulate.tool_failure_rate``'s failure.
        Exception: whatever the environment raised (the episode's infra failure).
    """
    if failure_seed is not None:
        if s.tool_latency_s:
            time.sleep(s.tool_latency_s)
        if s.tool_failure_rate and random.Random(failure_seed).random() < s.tool_failure_rate:
            raise InjectedToolFailure("simulate.tool_failure_rate")
    observation, reward, done, info = env.step(action)
    return ToolReply(str(observation), float(reward), bool(done), dict(info or {}))


def timed_step(env: Any, action: str, failure_seed: int | None, s: EpisodeSettings) -> ToolReply:
    """:func:`run_step`, given at most ``tools.timeout_s`` from now: a pool thread calls this
    when it takes the call, so the clock starts when the call starts running, never while it
    waits in the queue.

    The step runs on a thread of its own: a Python thread cannot be stopped, so a call past its
    timeout goes on there until it returns (its result is dropped), but the pool thread is free
    for the next call at the timeout. A queued call therefore waits at most ``tools.timeout_s``
    per round of the worker's ``tools.concurrency`` threads ahead of it.

    Raises:
        ToolTimeout: the step ran longer than ``tools.timeout_s``.
        InjectedToolFailure: the call drew ``simulate.tool_failure_rate``'s failure.
        Exception: whatever the environment raised (the episode's infra failure).
    """
    return _within(lambda: run_step(env, action, failure_seed, s), s.timeout_s, "tool call")


def timed_reset(env: Any, example: Any, s: EpisodeSettings) -> str:
    """``env.reset(example)``, given at most ``tools.timeout_s`` from now (as :func:`timed_step`:
    a reset past its timeout runs on, its result dropped). No episode holds an environment whose
    reset timed out, so when that reset still succeeds, the environment is closed then (an
    OpenEnv session it opened is ended, not left open on the server).

    Args:
        env: a new environment instance.
        example: the task row it starts on.
        s: the episode settings (``tools.timeout_s``).

    Returns:
        The first observation, as text.

    Raises:
        ToolTimeout: the reset ran longer than ``tools.timeout_s`` (the episode's infra failure).
        Exception: whatever the environment's ``reset`` raised.
    """
    reset = lambda: str(env.reset(example))  # noqa: E731
    return _within(reset, s.timeout_s, "environment reset", lambda: _close_quietly(env))


def _close_quietly(env: Any) -> None:
    """Close an environment no episode holds; a failure to close is logged, not raised (it
    happens on a thread nobody waits for)."""
    try:
        env.close()
    except Exception:  # noqa: BLE001 - nothing could act on it there
        log.warning(
            "%s.close() raised after a reset that outlived tools.timeout_s",
            type(env).__name__,
            exc_info=True,
        )


def _within(
    fn: Callable[[], Any], timeout_s: float, what: str, late: Callable[[], None] | None = None
) -> Any:
    """``fn()`` on a thread of its own, waited for at most ``timeout_s``; ``late`` runs once
    ``fn`` returns normally after the wait gave up (it undoes what the dropped result holds)."""
    out: Future = Future()

    def call() -> None:
        try:
            out.set_result(fn())
        except BaseException as exc:  # handed to the waiting thread
            out.set_exception(exc)

    threading.Thread(target=call, daemon=True, name="tool-call").start()
    try:
        return out.result(timeout=timeout_s)
    except FutureTimeout:
        if late is not None:  # runs at once when fn returned since the wait gave up
            undo = late
            out.add_done_callback(lambda done: None if done.exception() else undo())
        raise ToolTimeout(
            f"the {what} ran longer than tools.timeout_s={timeout_s}: raise tools.timeout_s "
            f"if the environment is that slow"
        ) from None


class ToolPool(Protocol):
    """Where episodes' environments live and their steps run."""

    def open(self, examples: Sequence[Any]) -> list[tuple[Any, str | None]]:
        """Start one environment per example: ``(handle, first observation)`` each; a reset
        that ran longer than ``tools.timeout_s`` gives ``(None, None)`` (the episode fails)."""

    def step(self, handle: Any, action: str, failure_seed: int | None) -> Future:
        """Run one action on the episode's environment: a future of its :class:`ToolReply`."""

    def close(self, handles: Sequence[Any]) -> None:
        """End the episodes' environments."""

    def check(self) -> None:
        """Raise :class:`~rltrain.errors.WorkerError` when the pool lost a worker."""


class LocalToolPool:
    """Environments in this process, steps on ``tools.concurrency`` threads (tests and the
    in-process benchmark; a run uses the ``tools`` component's actors).

    Args:
        run: the checked run config (``task.env``, ``tools.*``, ``simulate.*``).
    """

    def __init__(self, run: Any) -> None:
        self.env_class = load_env_class(run.task.env)
        self.settings = EpisodeSettings.from_run(run)
        self.threads = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="tool")

    def open(self, examples: Sequence[Any]) -> list[tuple[Any, str | None]]:
        out: list[tuple[Any, str | None]] = []
        for example in examples:
            env = self.env_class()
            try:
                out.append((env, timed_reset(env, example, self.settings)))
            except ToolTimeout:
                out.append((None, None))
        return out

    def step(self, handle: Any, action: str, failure_seed: int | None) -> Future:
        return self.threads.submit(timed_step, handle, action, failure_seed, self.settings)

    def close(self, handles: Sequence[Any]) -> None:
        for env in handles:
            env.close()

    def check(self) -> None:
        return None


class UnattachedToolPool:
    """The pool of a worker whose ``tools`` actors were not handed to it yet."""

    def _refuse(self, *args: Any) -> Any:
        raise WorkerError(
            "multi-turn episodes need the tool pool (component tools), and none was attached "
            "to this process: the runner hands it over at launch (use_tools)"
        )

    open = step = close = _refuse

    def check(self) -> None:
        return None


@dataclass
class Episode:
    """One sample's trajectory as it grows (response-side token lists, aligned)."""

    row: int
    handle: Any
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
    calling: bool = False
    past: Any = None  # the KV cache of the trajectory so far (but its last id), between turns

    def append(self, ids: Sequence[int], loss: float, logp: Sequence[float]) -> None:
        self.ids += list(ids)
        self.loss += [loss] * len(ids)
        self.logp += list(logp)


#: Distinct observation texts whose token ids a :class:`ToolEpisodes` keeps (then it starts over).
OBSERVATIONS_CACHED = 4096

#: Decoding steps a ready turn may wait for others to join with it (see ``_joins_now``).
JOIN_EVERY = 4


class ToolEpisodes:
    """Multi-turn episodes of ``task.env`` sampled with the torch sampler.

    Args:
        run: the checked run config.
        model: returns the policy to sample with (the rollout's copy, or the fused actor's).
        tokenizer: the policy's tokenizer.
        device: where the model is.
        eos_ids: the ids that end an episode's final turn.
        task: the built task (its rows give each episode's ``reset`` argument).
        pool: where the environments live and the steps run (None: a :class:`LocalToolPool`).

    Raises:
        ConfigError: ``task.env`` does not load (see :func:`load_env_class`).
        WorkerError: the tokenizer cannot spell the tool call's closing character, or two task
            rows share a prompt but not their answer (see :func:`rows_by_prompt`).
    """

    def __init__(
        self,
        run: Any,
        model: Callable[[], torch.nn.Module],
        tokenizer: Any,
        device: torch.device,
        eos_ids: Sequence[int],
        task: Any,
        pool: ToolPool | None = None,
    ) -> None:
        self.pool: ToolPool = LocalToolPool(run) if pool is None else pool
        self.settings = EpisodeSettings.from_run(run)
        self.params = SamplingParams.from_rollout(run.rollout)
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.call_ends = call_end_ids(tokenizer)
        self.rows = rows_by_prompt(task)
        self.context: int | None = None  # the model's max_position_embeddings, read per call
        self._observation_cache: dict[str, list[int]] = {}

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

    def evaluate(self, task: Any, seed: int = 0) -> float | None:
        """Share of the evaluation rows whose greedy episode earns the full reward (episodes
        that failed for infrastructure reasons are left out); ``seed`` draws the evaluation's
        ``simulate.tool_failure_rate`` failures (the caller's per evaluation).

        Returns:
            The accuracy; None when no episode was scored (every one infra-failed, or no
            evaluation rows): no accuracy was measured, which 0.0 would misreport.
        """
        rows = list(task.eval)
        if not rows:
            return None
        episodes = self._start([ex.prompt for ex in rows])
        greedy = dataclasses.replace(self.params, n=1, greedy=True)
        self._run(episodes, greedy, seed, False, None)
        scored = [e for e in episodes if not e.failed]
        if not scored:
            return None
        return sum(e.reward >= 1.0 for e in scored) / len(scored)

    # --------------------------------------------------------------------------- episodes
    def _start(self, prompts: Sequence[str]) -> list[Episode]:
        examples = []
        for prompt in prompts:
            example = self.rows.get(prompt)
            if example is None:
                raise WorkerError(f"prompt {prompt!r} is not a row of the task: no env to reset")
            examples.append(example)
        opened = self.pool.open(examples)
        # an episode whose reset timed out shows its row's prompt (trained on by nothing)
        pairs = zip(examples, opened, strict=True)
        texts = [ex.prompt if first is None else first for ex, (_, first) in pairs]
        firsts = prompt_token_ids(self.tokenizer, texts)  # one call
        episodes = []
        for row, ((handle, first), ids) in enumerate(zip(opened, firsts, strict=True)):
            e = Episode(row, handle, ids)
            e.done = e.failed = first is None
            episodes.append(e)
        return episodes

    def _run(
        self,
        episodes: list[Episode],
        params: SamplingParams,
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        """Every episode to its end, turns decoded by continuous batching; ``seed`` (the
        call's sampling seed: per step and rank) seeds each turn and each tool call's
        ``simulate.tool_failure_rate`` draw.

        Ready episodes (new ones, and those whose tool reply arrived) join the decoding batch
        at the next step while it has free slots; an episode leaves it when its turn ends and
        holds no slot while its tool runs. With nothing to decode, the loop waits for the
        first tool reply (the pool answers every call within ``tools.timeout_s`` of its start,
        a timeout as a failure).
        """
        model = self.model()
        was_training = model.training
        model.eval()
        self.context = model_context(model)
        self._truncate_full(episodes)
        decoder = self._decoder(model, params, len(episodes), with_logprobs)
        by_row = {e.row: e for e in episodes}
        ready = [e for e in episodes if not e.done]
        waiting: list[Episode] = []
        since_join = 0
        try:
            while ready or waiting or decoder.rows:
                if should_stop is not None and should_stop():
                    raise EpisodesStopped(_sampled_tokens(episodes, decoder))
                waiting = self._arrivals(waiting, ready, wait=not ready and not decoder.rows)
                if ready and decoder.free and self._joins_now(decoder, len(ready), since_join):
                    joining, ready = ready[: decoder.free], ready[decoder.free :]
                    requests = [self._request(e, params, seed) for e in joining]
                    ended, since_join = decoder.join(requests), 0
                else:
                    ended, since_join = decoder.step(), since_join + 1
                for result in ended:
                    e = by_row[result.key]
                    self._end_turn(e, result.ids, result.logprobs, seed)
                    if e.pending is not None:
                        e.past = result.past  # the next turn prefills only the new ids
                        waiting.append(e)
        finally:
            model.train(was_training)
            self.pool.close([e.handle for e in episodes if e.handle is not None])
        self.pool.check()  # a tool worker died: its episodes failed above, and the run stops

    def _truncate_full(self, episodes: list[Episode]) -> None:
        """End, truncated, every episode whose prompt already fills its room."""
        for e in episodes:
            if not e.done and self._remaining(e) <= 0:
                e.done = e.truncated = True

    def _decoder(
        self, model: Any, params: SamplingParams, episodes: int, with_logprobs: bool
    ) -> TurnDecoder:
        """The continuous-batching decoder of one call: ``tools.slots`` rows at once (0: every
        episode), a turn ending at an EOS or at the end of a tool call."""
        slots = self.settings.slots or episodes
        stops = {*self.eos_ids, *self.call_ends}
        return TurnDecoder(
            model, params, stops, self.tokenizer.pad_token_id, self.device, slots, with_logprobs
        )

    @staticmethod
    def _joins_now(decoder: TurnDecoder, ready: int, since_join: int) -> bool:
        """Whether ready turns join now: a join is one prefill forward pass, so turns that
        arrive one by one wait a few steps (:data:`JOIN_EVERY`) to join together, unless
        they fill the free slots or nothing else decodes."""
        return not decoder.rows or ready >= decoder.free or since_join >= JOIN_EVERY

    def _request(self, e: Episode, params: SamplingParams, seed: int) -> TurnRequest:
        budget = min(params.max_new_tokens, self._remaining(e))
        turn_seed = seeds.episode_turn_seed(seed, e.row, e.turns)
        past, e.past = e.past, None
        return TurnRequest(e.row, e.prompt + e.ids, budget, turn_seed, past)

    def _arrivals(self, waiting: list[Episode], ready: list[Episode], wait: bool) -> list[Episode]:
        """Collect the tool replies that arrived (blocking for the first when ``wait``): ready
        episodes go to ``ready``; returns the episodes still waiting."""
        if not waiting:
            return waiting
        if wait:  # bounded so that the caller looks at should_stop between waits
            pending = [e.pending for e in waiting if e.pending is not None]
            futures_wait(pending, timeout=self.settings.timeout_s, return_when=FIRST_COMPLETED)
        still = []
        for e in waiting:
            assert e.pending is not None
            if e.pending.done():
                self._collect(e)
                if e.done:
                    e.past = None
                else:
                    ready.append(e)
            else:
                still.append(e)
        return still

    def _remaining(self, e: Episode) -> int:
        """Tokens the episode may still add: ``rollout.max_total_tokens`` (null: unbounded but
        for the context), and the model's context, which prompt, turns and tool results share
        (a position past it is one the model never learned: it would train on garbage)."""
        room = self.settings.max_total_tokens - len(e.ids)
        if self.context is not None:
            room = min(room, self.context - len(e.prompt) - len(e.ids))
        return room

    def _end_turn(self, e: Episode, tokens: list[int], logp: list[float], seed: int) -> None:
        """Append a finished turn to its episode and hand its action to its environment."""
        e.append(tokens, 1.0, logp)
        e.turns += 1
        last = tokens[-1] if tokens else None
        if last in self.eos_ids:
            self._submit(e, self.tokenizer.decode(tokens[:-1]), False, seed)
        elif last in self.call_ends:
            text = self.tokenizer.decode(tokens)  # a merged "])" keeps its tail in the ids
            action = text[: text.rindex(CALL_END) + 1]
            if self._remaining(e) > 0 and e.turns < self.settings.max_turns:
                self._submit(e, action, True, seed)
            elif parse_call(action) is None:  # an answer ending in "]": the environment scores it
                self._submit(e, action, False, seed)
            else:  # a call with no turn left to read its result: not run
                e.done = e.truncated = True
        else:  # the token budget cut the turn
            e.done = e.truncated = True

    def _submit(self, e: Episode, action: str, calling: bool, seed: int) -> None:
        failure_seed = None
        if calling:  # drawn per (call's seed, row, call): timing never changes them, while
            e.requests += 1  # each step, rank and evaluation draws its own
            failure_seed = seeds.tool_failure_seed(seed, e.row, e.requests)
        e.calling = calling
        e.pending = self.pool.step(e.handle, action, failure_seed)

    def _collect(self, e: Episode) -> None:
        """Take an episode's finished step: its observation, reward and end."""
        if e.pending is None:
            return
        future, e.pending = e.pending, None
        try:
            reply: ToolReply = future.result()
        except Exception:  # raised, timed out or its worker died: the episode's failure
            e.calls += int(e.calling)
            e.done = e.failed = True
            return
        observation, done = reply.observation, reply.done
        if "tool" in reply.info:  # the env ran a tool (a turn ending in "]" may still be an answer)
            e.calls += 1
        if observation and not done:
            ids = self._observation_ids(observation)[: max(self._remaining(e), 0)]
            e.append(ids, 0.0, [0.0] * len(ids))
        e.reward = reply.reward
        if done:
            e.done = True
        elif e.turns >= self.settings.max_turns or self._remaining(e) <= 0:
            e.done = e.truncated = True

    def _observation_ids(self, observation: str) -> list[int]:
        """An observation's token ids (tokenised once per distinct text: tools repeat their
        replies, and a tokenizer call per reply costs more than the reply's decoding step)."""
        ids = self._observation_cache.get(observation)
        if ids is None:
            if len(self._observation_cache) >= OBSERVATIONS_CACHED:
                self._observation_cache.clear()
            ids = self.tokenizer(observation, add_special_tokens=False)["input_ids"]
            self._observation_cache[observation] = ids
        return ids

    # ------------------------------------------------------------------------------ batch
    def _batch(self, episodes: list[Episode], n: int, with_logprobs: bool) -> RolloutBatch:
        pad = self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = left_padded([e.prompt for e in episodes], pad, min_width=1)
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


def _sampled_tokens(episodes: Sequence[Episode], decoder: TurnDecoder) -> int:
    """Tokens sampled so far that the batch would have trained on: the ended turns of episodes
    not infra-failed (loss mask 1; observations have 0) and the turns still decoding."""
    ended = sum(int(sum(e.loss)) for e in episodes if not e.failed)
    return ended + sum(len(row.ids) for row in decoder.rows)


def rows_by_prompt(task: Any) -> dict[str, Any]:
    """Each prompt's task row, the row an episode of that prompt resets its environment with.

    Episodes reach the rollout as prompt texts (the driver hands every worker prompts), so a
    prompt must name one row; the task builder refuses a prompt given with two answers, and
    this refuses a task built by hand that has one rather than reset some episodes on a row
    that is not theirs.

    Args:
        task: a built task (``train`` and ``eval`` rows with ``prompt`` and ``answer``).

    Returns:
        ``prompt -> row`` (the first row of a prompt given on several rows with one answer).

    Raises:
        WorkerError: two rows share a prompt but not their answer.
    """
    rows: dict[str, Any] = {}
    for ex in (*task.train, *task.eval):
        first = rows.setdefault(ex.prompt, ex)
        if first.answer != ex.answer:
            raise WorkerError(
                f"task rows share the prompt {ex.prompt!r:.60} with different answers "
                f"({first.answer!r:.40} and {ex.answer!r:.40}): an episode finds its row by its "
                f"prompt, so give each row its own prompt text (e.g. name the problem id in the "
                f"prompt and show the environment's own first observation to the model)"
            )
    return rows


def model_context(model: Any) -> int | None:
    """The model's context (``config.max_position_embeddings``), or None if it has none."""
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(value) if value else None


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


def attach_pool(interaction: Interaction, pool: ToolPool) -> None:
    """Give a worker's multi-turn interaction the tool pool it sends its episodes to.

    Raises:
        WorkerError: the interaction is single-turn (the run has no ``task.env``).
    """
    if not isinstance(interaction, ToolEpisodes):
        raise WorkerError("a tool pool was handed to a single-turn rollout (no task.env)")
    interaction.pool = pool


def tool_episodes(
    run: Any,
    model: Callable[[], torch.nn.Module],
    tokenizer: Any,
    device: torch.device,
    eos_ids: Sequence[int],
) -> ToolEpisodes:
    """:class:`ToolEpisodes` for ``task.env``, its task built as the workers build it; its
    pool is attached at launch (:func:`attach_pool`), the ``tools`` component's actors."""
    from rltrain.tasks import build_task

    load_env_class(run.task.env)  # a bad task.env fails the worker's start, not its first step
    task = build_task(run.task, tokenizer)
    return ToolEpisodes(run, model, tokenizer, device, eos_ids, task, UnattachedToolPool())
