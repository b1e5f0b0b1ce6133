"""The rollout: samples responses with the latest weights it was sent.

The generation engine (``rollout.backend``: the torch sampler, or one vLLM engine per process
spanning its tensor-parallel devices) sits behind
:class:`~rltrain.backends.generation.GenerationEngine`; this worker owns the calls (prompts,
step, weight version), the weight loads and the residency calls.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import GenerationStopped
from rltrain.backends.generation import GenerationEngine, build_generation, sampling_seed
from rltrain.config.schema import RunConfig
from rltrain.scheduler import Worker
from rltrain.tasks import build_task
from rltrain.telemetry import trace
from rltrain.workers.common import (
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
        self.version = -1  # no weights received yet: the first export is the starting version
        self._task: Any = None

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
    ) -> RolloutBatch | None:
        """Sample ``n`` responses for each prompt.

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

        Returns:
            A CPU batch of ``len(prompts) * n`` rows; ``None`` when the call was cancelled
            (``ray.cancel``: a partial rollout restarted with newer weights) before it ended.

        Raises:
            WorkerError: the weights held are older than ``expect_version``.
        """
        self._sync(weights, expect_version)
        with trace.span("generate", "rollout", self.device_labels):
            try:
                batch = as_rollout_logprobs(
                    self.engine.generate(
                        prompts,
                        sampling_seed(self.run, step, self.rank),
                        behaviour_logprobs,
                        _cancelled,
                    )
                )
                wait = modelled_generate_s(self.run.simulate, batch)  # a slower device
                if wait:
                    _sleep_unless_cancelled(wait)
            except GenerationStopped:
                return None  # nobody reads a cancelled call's result
            return batch

    def evaluate(self, weights: Any = None) -> float:
        """Greedy accuracy on the task's evaluation prompts, with the given weights."""
        self._sync(weights, None)
        if self._task is None:
            self._task = build_task(self.run.task, self.tokenizer)
        with trace.span("evaluate", "rollout", self.device_labels):
            return self.engine.evaluate(self._task)

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


def modelled_generate_s(sim: Any, batch: Any) -> float:
    """``simulate.*``'s device time of a generate call: ``rollout_latency_ms`` plus
    ``rollout_token_latency_ms`` per decoding step (the batch's longest response).

    Args:
        sim: the ``simulate`` section.
        batch: the call's batch (its ``response_mask``), or None.

    Returns:
        Seconds to wait (0 when the knobs are off).
    """
    seconds = sim.rollout_latency_ms / 1000
    if sim.rollout_token_latency_ms and batch is not None:
        steps = int(batch.response_mask.sum(dim=1).max()) if len(batch.response_mask) else 0
        seconds += sim.rollout_token_latency_ms * steps / 1000
    return seconds


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


def _sleep_unless_cancelled(seconds: float, poll_s: float = 0.01) -> None:
    """Sleep, but give up (``GenerationStopped``) within ``poll_s`` of a cancellation."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if _cancelled():
            raise GenerationStopped
        time.sleep(min(left, poll_s))
