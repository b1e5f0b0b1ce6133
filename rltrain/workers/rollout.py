"""The rollout: samples responses with the latest weights it was sent.

The generation engine (``rollout.backend``: the torch sampler, or one vLLM engine per process
spanning its tensor-parallel devices) sits behind
:class:`~rltrain.backends.generation.GenerationEngine`; this worker owns the calls (prompts,
step, weight version), the weight loads and the residency calls.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from typing import Any

import torch

from rltrain.agents.interaction import (
    EpisodesStopped,
    Interaction,
    attach_pool,
    engine_interaction,
)
from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import GenerationStopped, encode_prompts
from rltrain.backends import continuation
from rltrain.backends.continuation import Parked
from rltrain.backends.generation import GenerationEngine, build_generation, sampling_seed
from rltrain.config import seeds
from rltrain.config.schema import RunConfig
from rltrain.scheduler import Worker
from rltrain.tasks import build_task
from rltrain.telemetry import trace
from rltrain.whatif.lengths import simulated as simulated_lengths
from rltrain.whatif.slots import DEFAULT_SEGMENT, CarryBuffer, Decoder
from rltrain.workers.batching import concat_batches
from rltrain.workers.common import (
    HostBuffers,
    ResidentState,
    WeightReceiver,
    as_rollout_logprobs,
    compute_device,
)


class RolloutWorker(Worker, WeightReceiver, ResidentState):
    """One generation process; holds a copy of the policy and no optimizer.

    Args:
        run: the checked run config.

    Raises:
        ConfigError: ``rollout.backend=vllm`` without vLLM.
        ResourceError: ``rollout.backend=vllm`` without the GPUs its TP size needs.
    """

    def __init__(self, run: RunConfig) -> None:
        self.run = run
        self.device = compute_device(self)
        self.engine: GenerationEngine = build_generation(run, self.device, self.rank)
        # single-turn responses, or multi-turn episodes of task.env (rltrain.agents)
        self.interaction: Interaction = engine_interaction(run, self.engine)
        self.version = -1  # no weights received yet: the first export is the starting version
        self._task: Any = None
        # trainer.partial_rollout=continue: generations paused at a weight swap, by step, and
        # generations that ended before their pause arrived (a resume call hands them on)
        self._continues = run.trainer.partial_rollout == "continue"  # a call may say otherwise
        self._parked: HostBuffers = HostBuffers()  # step -> Parked
        self._ended: HostBuffers = HostBuffers()  # step -> RolloutBatch
        self._discarded: dict[int, int] = {}  # tokens thrown away per step (``restart``)
        # simulate.response_length_median: seconds of a paused call's modelled decoding done
        self._modelled: dict[int, float] = {}
        self._carry: Carry | None = None  # trainer.partial_rollout=carry: groups across calls

    def use_tools(self, actors: list[Any]) -> None:
        """Send this rank's episodes' tool calls to the tool pool's workers (launch)."""
        # imports Ray: the vLLM bundle's steps import this module without it
        from rltrain.workers.tools import RayToolPool

        attach_pool(self.interaction, RayToolPool(actors))

    # The engine owns the model and its memory; properties keep them out of the worker's own
    # attributes, so the ledger's walk reaches each tensor once.
    @property
    def model(self) -> torch.nn.Module:
        """The torch engine's model (the vLLM engine has none in this process)."""
        return self.engine.model  # type: ignore[attr-defined]

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer  # type: ignore[attr-defined]

    @property
    def mover(self) -> Any:  # type: ignore[override]
        """The engine's residency surface (a state mover, or vLLM's sleep/wake)."""
        return self.engine.mover

    def offload(self, kinds: list[str]) -> int:
        """Move state kinds off the device (``kv_cache`` only where the engine holds one)."""
        known = set(self.mover.resident_bytes())
        with trace.span("offload", self.group_name, self.device_labels):
            return self.mover.offload([k for k in kinds if k in known])

    def reload(self, kinds: list[str]) -> int:
        """Bring state kinds back (vLLM: the weights; its KV cache wakes at the next generate)."""
        known = set(self.mover.resident_bytes())
        with trace.span("reload", self.group_name, self.device_labels):
            return self.mover.reload([k for k in kinds if k in known])

    def generate(
        self,
        prompts: list[str],
        step: int,
        weights: Any = None,
        expect_version: int | None = None,
        behaviour_logprobs: bool = True,
        resume: bool = False,
        partial_rollout: str | None = None,
        oldest_version: int | None = None,
        hand_on: bool = True,
        due_version: int | None = None,
        extend: bool = False,
        segment: int | None = None,
    ) -> RolloutBatch | None:
        """Sample ``n`` responses for each prompt.

        With ``trainer.partial_rollout=continue`` a cancelled call (``ray.cancel``: a weight
        swap) parks the rows sampled so far instead of dropping them, and a later call with
        ``resume=True`` for the same step continues them under the weights it is handed.

        Args:
            prompts: this rank's prompts.
            step: the policy-update index (seeds sampling, so a resumed run samples the same).
            weights: the newest weights handed over (host buckets, IPC payloads by actor rank,
                or a collective version marker); loaded first unless already held.
            expect_version: refuse to sample with an older weight version than this.
            behaviour_logprobs: record the sampling policy's per-token log-probs as
                ``rollout_logprobs`` (those of the distribution sampled: temperature and top-p
                applied). The actor compares them with its own (the parity check), takes them
                as pi_old with ``algorithm.old_logprobs=rollout``, and weighs its loss by them
                (truncated importance sampling) with ``recompute``.
            resume: continue the generation of ``step`` parked at a pause (or hand on the one
                that ended before its pause arrived); with nothing held for ``step``, sample
                afresh.
            partial_rollout: the schedule's ``trainer.partial_rollout`` (None: the config's);
                ``continue`` keeps a cancelled call's rows; ``carry`` hands on complete groups
                from the rank's carried rows (:meth:`_carried`).
            oldest_version: ``carry``: groups started with an older version are dropped
                (``step - max_staleness``; None: ``expect_version``).
            hand_on: ``carry``: False only queues the new groups and returns None (the first
                call of a schedule, so that later calls have groups to carry).
            due_version: ``carry``: groups started before this version are finished in this
                call however long their rows (the next call's ``oldest_version``: it would
                drop them); None: ``oldest_version + 1``.
            extend: ``carry`` with ``hand_on=False``: add the groups to the buffer instead of
                starting a new one (the later calls of a prime ``trainer.carry_surplus`` deep).
            segment: ``carry``: the new buffer's segment (None: ``trainer.carry_segment``).

        Returns:
            A CPU batch of ``len(prompts) * n`` rows, ``token_versions`` set; ``None`` when
            the call was cancelled before it ended (its result is never read).

        Raises:
            WorkerError: the weights held are older than ``expect_version``.
        """
        self._sync(weights, expect_version)
        if partial_rollout is not None:
            self._continues = partial_rollout == "continue"
        if (partial_rollout or self.run.trainer.partial_rollout) == "carry":
            oldest = expect_version if oldest_version is None else oldest_version
            new = None if hand_on or extend else segment or 0
            return self._carried(
                prompts, step, behaviour_logprobs, oldest or 0, hand_on, due_version, new
            )
        self._forget_before(step)
        if resume and step in self._ended:
            return self._resume_ended(step)
        parked = self._parked.pop(step, None) if resume else None
        with trace.span("generate", "rollout", self.device_labels):
            try:
                done = self._sample(prompts, step, behaviour_logprobs, parked)
            except GenerationStopped as stop:
                lost = stop.sampled_tokens if isinstance(stop, EpisodesStopped) else 0
                self._park(step, parked, stop.partial, lost)
                return None  # nobody reads a cancelled call's result
            batch = self._handed_on(step, done)
            try:
                self._modelled_decoding(step, batch)
                if self.run.simulate.rollout_latency_ms:  # a slower device: its fixed cost
                    _sleep_unless_cancelled(self.run.simulate.rollout_latency_ms / 1000)
            except GenerationStopped:
                if not self._continues:
                    self._count_discarded(step, batch)
                return None
            return batch

    def _carried(
        self,
        prompts: list[str],
        step: int,
        logprobs: bool,
        oldest: int,
        hand_on: bool = True,
        due: int | None = None,
        new: int | None = None,
    ) -> RolloutBatch | None:
        """``trainer.partial_rollout=carry``: queue the new prompts' groups behind the rows
        carried from earlier calls and hand on the ``len(prompts)`` oldest groups complete; the
        rest is carried to the next call. On the torch engine the rows decode for real in
        segments (:meth:`_segments`); on the modelled device (``simulate.response_length_median``)
        they are sampled whole at admission and :class:`CarryBuffer` decodes their modelled
        lengths. Groups started before ``oldest`` are dropped first, their tokens counted in
        ``discarded_tokens``, and their prompts queued again with the weights held (so the
        buffer keeps its surplus of groups over what a call hands on); groups started before
        ``due`` are finished in this call (:meth:`CarryBuffer.run`). A prime's first call
        starts a new buffer, segmented by ``new`` (0: :data:`DEFAULT_SEGMENT`; None: keep the
        buffer)."""
        rows = len(prompts) * self.run.rollout.n_samples_per_prompt
        state = self._carry_state(step, rows, new)
        with trace.span("generate", "rollout", self.device_labels):
            if not self.run.simulate.response_length_median:
                state.restamp(self.version)
            dropped = state.buffer.run(0, oldest).dropped  # past the bound: queued again
            again = [state.prompts[k] for k in dropped]
            discarded = state.drop(dropped)
            try:
                self._admit(state, again, self._redo_seed(step), step, logprobs)
                self._admit(state, prompts, None, step, logprobs)
                if not hand_on:
                    return None
                decode = self._segments(state, step, logprobs)
                done = state.buffer.run(len(prompts), oldest, decode, due)
                state.tally(done)
                self._carry_wait(done.steps)
            except GenerationStopped:
                state.lose()  # a reset: the call's result is never read
                return None
            shard = concat_batches(
                state.take(done.ready, self.tokenizer_pad_id), self.tokenizer_pad_id
            )
            return dataclasses.replace(shard, discarded_tokens=discarded)

    def _admit(
        self, state: Carry, prompts: list[str], seed: int | None, step: int, logprobs: bool
    ) -> None:
        """``carry``: queue ``prompts``' groups with the weights held: on the torch engine as
        rows with no token yet; on the modelled device sampled whole (with ``seed``, or the
        step's sampling seed).

        Raises:
            GenerationStopped: cancelled while sampling (the modelled device).
        """
        if not prompts:
            return
        if not self.run.simulate.response_length_median:
            ids, mask = encode_prompts(self.tokenizer, prompts)
            state.admit_prompts(ids, mask, prompts, self.version, self.run, logprobs)
            return
        sampled = self._sample_rows(
            prompts, sampling_seed(self.run, step, self.rank) if seed is None else seed, logprobs
        )
        state.admit(sampled, prompts, self.version, self.run, seed, step, self.rank)

    def _segments(self, state: Carry, step: int, logprobs: bool) -> Decoder | None:
        """``carry`` on the torch engine: the decoder of the call's segments. Each segment
        continues the rows holding slots with ``continue_rows`` (their prefix recomputed under
        the weights held), each row's tokens appended with this version (:func:`stitch`); None
        on the modelled device (the buffer decodes its modelled lengths)."""
        if self.run.simulate.response_length_median:
            return None
        budget, pad = self.run.rollout.max_new_tokens, self.tokenizer_pad_id

        def decode(rows: list[tuple[int, int]], seg: int) -> dict[tuple[int, int], int]:
            parked = [state.live[k][r] for k, r in rows]
            ids, mask = continuation.joined_prompts(parked, pad)
            seed = seeds.segment_seed(self.run.seed, step, self.rank, state.next_part())
            more = self.engine.continue_rows(ids, mask, seg, seed, logprobs, self._decode_step)
            ended: dict[tuple[int, int], int] = {}
            for i, ((k, r), row) in enumerate(zip(rows, parked, strict=True)):
                part = continuation.first_columns(
                    more.select(torch.tensor([i])), budget - row.columns
                )
                state.live[k][r] = continuation.stitch(row, part, self.version, pad)
                truncated = state.live[k][r].batch.truncated
                if truncated is not None and not bool(truncated[0]):  # sampled its EOS
                    ended[(k, r)] = continuation.sampled_tokens(part)
            return ended

        return decode

    def _carry_wait(self, steps: int) -> None:
        """``carry``: a call's modelled device time (``simulate.*``): per decoding step of the
        modelled lengths (the torch engine waits per real step, :meth:`_decode_step`), then the
        fixed cost.

        Raises:
            GenerationStopped: cancelled while waiting.
        """
        sim = self.run.simulate
        if sim.response_length_median:
            _sleep_unless_cancelled(sim.rollout_token_latency_ms * steps / 1000)
        if sim.rollout_latency_ms:
            _sleep_unless_cancelled(sim.rollout_latency_ms / 1000)

    def _sample_rows(self, prompts: list[str], seed: int, logprobs: bool) -> RolloutBatch:
        """``carry`` on the modelled device: sample ``prompts``' rows whole with the weights
        held."""
        batch = self.interaction.generate(prompts, seed, logprobs, self._decode_step)
        return self._versioned(batch)

    def _redo_seed(self, step: int) -> int:
        """``carry``: the seed of groups sampled again after the bound dropped them (apart from
        the step's own; a carry run has no continuations to meet)."""
        return seeds.continuation_seed(self.run.seed, step, self.rank, self.version)

    def _versioned(self, batch: RolloutBatch) -> RolloutBatch:
        """A fresh batch with its token versions (all the weights held) and behaviour
        log-probs in ``rollout_logprobs``."""
        return as_rollout_logprobs(
            continuation.finished(continuation.park(batch, self.version, self.version))
        )

    def _carry_state(self, step: int, rows: int, new: int | None) -> Carry:
        """The rank's carried groups; a prime's first call (``new``: its segment, 0 for
        ``trainer.carry_segment``), or one for an earlier step than the last, starts a new
        buffer (a new schedule or a resumed run: what was carried can no longer train). The
        device decodes ``rows`` (one call's rows) at once."""
        if new is not None or self._carry is None or step <= self._carry.last_step:
            segment = new or self.run.trainer.carry_segment or DEFAULT_SEGMENT
            self._carry = Carry(CarryBuffer(rows, segment))
        self._carry.last_step = step
        return self._carry

    def carry_left(self) -> dict[str, int]:
        """``carry``: the ``groups`` this rank still holds and those a cancelled call lost since
        the last ask, with their sampled ``tokens``; forgets them (at a run's end they never
        train: they count as discarded). Zeros for other policies."""
        if self._carry is None:
            return {"groups": 0, "tokens": 0}
        return self._carry.left()

    def carry_stats(self) -> dict[str, int]:
        """``carry``: the modelled decoding so far (steps, busy row-steps, slot-steps,
        groups handed on and dropped, rows carried now); empty for other policies."""
        return {} if self._carry is None else self._carry.stats()

    def _resume_ended(self, step: int) -> RolloutBatch | None:
        """A resumed call whose rows had all ended: it finishes the modelled decoding its pause
        cut short (``simulate.response_length_median``), pays a call's fixed cost
        (``simulate.rollout_latency_ms``: the paused call never returned, so this is a call
        again, as the what-if simulator's continued call is), then hands the batch on."""
        latency_s = self.run.simulate.rollout_latency_ms / 1000
        if step in self._modelled or latency_s:
            with trace.span("generate", "rollout", self.device_labels):
                try:
                    self._modelled_decoding(step, self._ended[step])
                    if latency_s:
                        _sleep_unless_cancelled(latency_s)
                except GenerationStopped:
                    return None  # paused again: the progress is kept
        return self._ended.pop(step)

    def _modelled_decoding(self, step: int, batch: RolloutBatch) -> None:
        """``simulate.response_length_median``: wait ``rollout_token_latency_ms`` per decoding
        step of the call's longest modelled row, less what a paused pass of it waited already
        (with ``continue``; ``restart`` and ``finish`` start again from 0).

        Raises:
            GenerationStopped: cancelled (a weight swap) before the wait ended.
        """
        sim = self.run.simulate
        if not sim.response_length_median:
            return
        total = sim.rollout_token_latency_ms * modelled_steps(self.run, step, self.rank, batch)
        done = self._modelled.pop(step, 0.0)
        start = time.monotonic()
        try:
            _sleep_unless_cancelled(total / 1000 - done)
        except GenerationStopped:
            if self._continues:
                self._modelled[step] = done + time.monotonic() - start
            raise

    def _handed_on(self, step: int, done: Parked) -> RolloutBatch:
        """The finished rows as the batch the actor gets (with the step's discarded count
        when the pipeline runs ahead); kept for a late pause's resume with ``continue``."""
        batch = as_rollout_logprobs(continuation.finished(done))
        if self.run.trainer.max_staleness >= 1:
            batch = batch.replace(discarded_tokens=self._discarded.pop(step, 0))
        if self._continues:  # a pause that comes too late resumes to this batch
            self._ended[step] = batch
        return batch

    def _count_discarded(self, step: int, batch: Any, tokens: int = 0) -> None:
        """Add ``batch``'s sampled tokens (if any, :func:`policy_tokens`) and ``tokens`` to the
        step's discarded."""
        if batch is not None:
            tokens += policy_tokens(batch)
        if tokens:
            self._discarded[step] = self._discarded.get(step, 0) + tokens

    def _sample(
        self, prompts: list[str], step: int, logprobs: bool, parked: Parked | None
    ) -> Parked:
        """Sample the step's rows afresh, or continue the parked ones with the weights held.

        Raises:
            GenerationStopped: cancelled between decoding steps (``partial``: the new rows).
        """
        seed = sampling_seed(self.run, step, self.rank)
        if parked is None:
            batch = self.interaction.generate(prompts, seed, logprobs, self._decode_step)
            return continuation.park(batch, self.version, self.version)
        ids, mask = continuation.continuation_prompts(parked)
        budget = self.run.rollout.max_new_tokens - parked.columns
        seed = seeds.continuation_seed(self.run.seed, step, self.rank, self.version)
        try:
            more = self.engine.continue_rows(ids, mask, budget, seed, logprobs, self._decode_step)
        except GenerationStopped as stop:
            if stop.partial is None:
                raise GenerationStopped(None) from stop
            raise GenerationStopped(self._stitched(parked, stop.partial)) from stop
        return self._stitched(parked, more)

    def _stitched(self, parked: Parked, more: RolloutBatch) -> Any:
        return continuation.stitch(parked, more, self.version, self.tokenizer_pad_id)

    def _park(self, step: int, before: Parked | None, partial: Any, lost: int = 0) -> None:
        """Keep a paused generation's rows (``continue``); ``partial`` is what the stopped
        call sampled: a first pass's batch, or a continuation already stitched to ``before``.
        ``lost``: tokens it sampled that no partial batch holds (multi-turn episodes, which
        are never paused), discarded with any policy."""
        self._count_discarded(step, None, lost)
        if not self._continues:
            self._count_discarded(step, partial)
            return
        if isinstance(partial, Parked):
            self._parked[step] = partial
        elif partial is not None:
            self._parked[step] = continuation.park(partial, self.version, self.version)
        elif before is not None:  # stopped before its first new token: keep what it had
            self._parked[step] = before

    def _forget_before(self, step: int) -> None:
        """Drop what was held for steps no call can resume any more. The pipeline submits a
        call for ``step`` at its fill of step ``step - max_staleness`` or later, when every
        older step has been taken (trained), and it resumes only steps it has not taken; the
        rollout runs its calls in the order they arrive, so anything older is abandoned."""
        oldest = step - self.run.trainer.max_staleness
        for held in (self._parked, self._ended, self._discarded, self._modelled):
            for s in [s for s in held if s < oldest]:
                del held[s]

    @property
    def tokenizer_pad_id(self) -> int:
        return int(self.engine.tokenizer.pad_token_id)  # type: ignore[attr-defined]

    def _decode_step(self) -> bool:
        """Asked before every decoding step: wait out ``simulate.rollout_token_latency_ms``
        (a slower device's time per token; with modelled lengths the call waits after its real
        decoding instead) and say whether the call was cancelled."""
        sim = self.run.simulate
        ms = 0.0 if sim.response_length_median else sim.rollout_token_latency_ms
        if ms:
            try:
                _sleep_unless_cancelled(ms / 1000)
            except GenerationStopped:
                return True
        return _cancelled()

    def evaluate(self, weights: Any = None) -> float | None:
        """Greedy accuracy on the task's evaluation prompts, with the given weights (the
        evaluation's seed follows their version, so each evaluation of a run draws its own
        ``simulate.tool_failure_rate`` failures, and a resumed run the same); None when no
        multi-turn evaluation episode was scored (every one infra-failed)."""
        self._sync(weights, None)
        if self._task is None:
            self._task = build_task(self.run.task, self.tokenizer)
        seed = seeds.eval_episode_seed(self.run.seed, max(self.version, 0), 0)
        with trace.span("evaluate", "rollout", self.device_labels):
            return self.interaction.evaluate(self._task, seed)

    def memory_report(self) -> dict[str, Any]:
        """Ledger bytes vs the independent measure (see :class:`ResidentState`).

        vLLM's memory lives in its own allocator (and processes), where no walk of this
        worker's tensors can see it: there the engine's bytes are its own ledger's, and the
        walk checks what the worker holds outside the engine.

        Raises:
            WorkerError: the worker holds device bytes its ledger does not declare.
        """
        if self.engine.walk_sees_state:
            return super().memory_report()
        return self.memory_report_beside(self.engine, "generation engine", "vLLM's allocator")


class Carry:
    """A rollout rank's carried prompt groups (``trainer.partial_rollout=carry``): the slot
    schedule (:class:`CarryBuffer`) and each group's rows by key: sampled whole on the
    modelled device (``rows``), or each row as far as the torch engine decoded it (``live``).

    Args:
        buffer: the slot schedule.
    """

    def __init__(self, buffer: CarryBuffer) -> None:
        self.buffer = buffer
        self.rows: HostBuffers = HostBuffers()  # key -> RolloutBatch
        self.live: HostBuffers = HostBuffers()  # key -> list[Parked]
        self.prompts: dict[int, str] = {}
        self.last_step = -(2**62)
        self._next = 0
        self._part = 0  # segments decoded (each draws its own seed)
        self._tally = {
            "steps": 0,
            "busy": 0,
            "slot_steps": 0,
            "handed_on": 0,
            "dropped": 0,
            "lost_groups": 0,
            "lost_tokens": 0,
        }

    def _key(self, prompt: str) -> int:
        key, self._next = self._next, self._next + 1
        self.prompts[key] = prompt
        return key

    def admit(
        self,
        batch: RolloutBatch,
        prompts: list[str],
        version: int,
        run: RunConfig,
        seed: int | None,
        step: int,
        rank: int,
    ) -> None:
        """Queue ``batch``'s groups (consecutive ``n`` rows per prompt) with their modelled
        lengths, drawn as :func:`modelled_steps` draws them for ``step`` and ``rank`` (or with
        ``seed``: groups sampled again)."""
        n = run.rollout.n_samples_per_prompt
        rows = len(batch.response_mask)
        rng = random.Random(sampling_seed(run, step, rank) if seed is None else seed)
        lengths = simulated_lengths(run.simulate.response_length_median).sample(rng, rows)
        for i, first in enumerate(range(0, rows, n)):
            key = self._key(prompts[i])
            self.rows[key] = batch.select(torch.arange(first, min(first + n, rows)))
            self.buffer.admit(key, version, lengths[first : first + n])

    def admit_prompts(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        prompts: list[str],
        version: int,
        run: RunConfig,
        logprobs: bool,
    ) -> None:
        """Queue one group of ``n`` rows per prompt (``[b, P]`` encoded), no token sampled yet;
        each row may decode ``rollout.max_new_tokens``."""
        n, budget = run.rollout.n_samples_per_prompt, run.rollout.max_new_tokens
        for i, prompt in enumerate(prompts):
            key = self._key(prompt)
            one = (ids[i : i + 1], mask[i : i + 1])
            self.live[key] = [continuation.start(*one, version, logprobs) for _ in range(n)]
            self.buffer.admit(key, version, [budget] * n)

    def restamp(self, version: int) -> None:
        """Groups with no token sampled yet count their staleness from ``version`` (the
        weights that will sample their first token: the torch engine)."""
        for key in self.prompts:
            if not self.tokens(key):
                self.buffer.stamp(key, version)

    def next_part(self) -> int:
        """The index of the next decoded segment (its seed)."""
        self._part += 1
        return self._part - 1

    def tokens(self, key: int) -> int:
        """Response tokens group ``key`` has sampled so far."""
        if key in self.rows:
            return continuation.sampled_tokens(self.rows[key])
        return sum(continuation.sampled_tokens(p.batch) for p in self.live[key])

    def _forget(self, keys: tuple[int, ...]) -> int:
        tokens = sum(self.tokens(k) for k in keys)
        for k in keys:
            del self.prompts[k]
            self.rows.pop(k, None)
            self.live.pop(k, None)
        return tokens

    def drop(self, keys: tuple[int, ...]) -> int:
        """Forget groups; returns the response tokens they had sampled (discarded)."""
        self._tally["dropped"] += len(keys)
        return self._forget(keys)

    def lose(self) -> int:
        """Forget every group held (a cancelled call, or the run's end); returns their tokens,
        added to the ``lost_*`` totals."""
        keys = tuple(self.prompts)
        self.buffer.groups.clear()
        self._tally["lost_groups"] += len(keys)
        tokens = self._forget(keys)
        self._tally["lost_tokens"] += tokens
        return tokens

    def left(self) -> dict[str, int]:
        """The groups held and those lost since the last ask, with their tokens; forgets the
        groups held (:meth:`lose`)."""
        self.lose()
        out = {"groups": self._tally["lost_groups"], "tokens": self._tally["lost_tokens"]}
        self._tally["lost_groups"] = self._tally["lost_tokens"] = 0
        return out

    def take(self, keys: tuple[int, ...], pad_token_id: int) -> list[RolloutBatch]:
        """The rows of the groups handed on, in order (token versions and ``rollout_logprobs``
        set)."""
        self._tally["handed_on"] += len(keys)
        out = []
        for k in keys:
            del self.prompts[k]
            if k in self.rows:
                out.append(self.rows.pop(k))
                continue
            rows = [as_rollout_logprobs(continuation.finished(p)) for p in self.live.pop(k)]
            group = concat_batches(rows, pad_token_id)
            out.append(dataclasses.replace(group, group_size=len(rows)))
        return out

    def tally(self, done: Any) -> None:
        """Add a call's decoding to the totals."""
        for key in ("steps", "busy", "slot_steps"):
            self._tally[key] += getattr(done, key)

    def stats(self) -> dict[str, int]:
        return {**self._tally, "carried_rows": self.buffer.carried_rows()}


def modelled_generate_s(run: RunConfig, batch: Any, step: int, rank: int) -> float:
    """``simulate.*``'s device time of a generate call: ``rollout_latency_ms`` plus
    ``rollout_token_latency_ms`` per decoding step (:func:`modelled_steps`).

    Args:
        run: the run config (its ``simulate`` section).
        batch: the call's batch (its ``response_mask``), or None.
        step: the step it generates for.
        rank: the rollout rank.

    Returns:
        Seconds to wait (0 when the knobs are off).
    """
    sim = run.simulate
    seconds = sim.rollout_latency_ms / 1000
    if sim.rollout_token_latency_ms and batch is not None:
        seconds += sim.rollout_token_latency_ms * modelled_steps(run, step, rank, batch) / 1000
    return seconds


def modelled_steps(run: RunConfig, step: int, rank: int, batch: Any) -> int:
    """The decoding steps a generate call is charged: its longest response in tokens or, with
    ``simulate.response_length_median``, the longest of its rows' modelled lengths (drawn per
    step and rank, as the what-if simulator draws them: the same for a restarted call).

    Args:
        run: the run config.
        step: the step the call generates for.
        rank: the rollout rank.
        batch: the call's batch (its ``response_mask``: one row per response).

    Returns:
        Decoding steps (0 for an empty batch).
    """
    rows = len(batch.response_mask)
    if not rows:
        return 0
    median = run.simulate.response_length_median
    if median:
        rng = random.Random(sampling_seed(run, step, rank))
        return max(simulated_lengths(median).sample(rng, rows))
    return int(batch.response_mask.sum(dim=1).max())


def _cancelled() -> bool:
    """Whether the Ray call running this code was cancelled (``ray.cancel`` on its ref).

    Ray only flags a running actor call; the call itself must look (between decoding steps).
    A process that never imported Ray runs no Ray call, so nothing can cancel it, and Ray is
    not imported to say so: the vLLM steps of a GPU lease run this worker with vLLM alone
    (tools/gpu/README.md).
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    try:
        return ray.get_runtime_context().is_canceled()
    except RuntimeError:  # not inside a task (a worker built directly, in a unit test)
        return False


def policy_tokens(batch: Any) -> int:
    """The tokens a batch would have trained on, the ones the policy sampled: a multi-turn
    batch's ``loss_mask`` (tool results are 0 there, and so is an infra-failed episode
    throughout, as :class:`~rltrain.agents.interaction.EpisodesStopped` counts), else every
    response token.

    Args:
        batch: a :class:`~rltrain.algorithms.batch.RolloutBatch`, or a parked generation.

    Returns:
        The token count.
    """
    loss_mask = getattr(batch, "loss_mask", None)
    if loss_mask is None:
        return continuation.sampled_tokens(batch)
    return int(loss_mask.sum())


def _sleep_unless_cancelled(seconds: float, poll_s: float = 0.01) -> None:
    """Sleep, but give up (``GenerationStopped``) within ``poll_s`` of a cancellation."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if _cancelled():
            raise GenerationStopped
        time.sleep(min(left, poll_s))
