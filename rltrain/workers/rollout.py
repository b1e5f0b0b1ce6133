"""The rollout: samples responses with the latest weights it was sent (torch backend)."""

from __future__ import annotations

import time

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import (
    GenerationStopped,
    SamplingParams,
    greedy_accuracy,
)
from rltrain.backends.offload import StateMover
from rltrain.backends.weight_sync.host import HostBuckets, load_from_host
from rltrain.config.schema import RunConfig
from rltrain.errors import WorkerError
from rltrain.scheduler import Worker
from rltrain.tasks import build_model, build_task, build_tokenizer
from rltrain.telemetry import trace
from rltrain.workers.common import ResidentState, compute_device, sample_prompts


class RolloutWorker(Worker, ResidentState):
    """One generation process; holds a copy of the policy and no optimizer.

    Args:
        run: the checked run config.
    """

    def __init__(self, run: RunConfig) -> None:
        self.run = run
        self.device = compute_device(self)
        self.tokenizer = build_tokenizer(run.model)
        self.model = build_model(run.model).to(self.device)
        self.model.requires_grad_(False)
        self.mover = StateMover(self.model, None, device=self.device)
        self.params = SamplingParams.from_rollout(run.rollout)
        self.version = 0
        self._task = None

    def _sync(self, weights: HostBuckets | None, expect: int | None) -> None:
        if weights is not None and weights.version != self.version:
            with trace.span("sync", "rollout", self.device_labels):
                load_from_host(weights, dict(self.model.named_parameters()))
            self.version = weights.version
        if expect is not None and self.version < expect:
            raise WorkerError(
                f"rollout rank {self.rank} holds weight version {self.version} but the step "
                f"needs {expect}: the actor's weights were not sent"
            )

    def generate(
        self,
        prompts: list[str],
        step: int,
        weights: HostBuckets | None = None,
        expect_version: int | None = None,
        behaviour_logprobs: bool = False,
    ) -> RolloutBatch | None:
        """Sample ``n`` responses for each prompt.

        Args:
            prompts: this rank's prompts.
            step: the policy-update index (seeds sampling, so a resumed run samples the same).
            weights: new weights to load first (skipped when already at that version).
            expect_version: refuse to sample with an older weight version than this.
            behaviour_logprobs: also record the sampling policy's per-token log-probs as
                ``old_logprobs`` (asynchronous training: the actor's clipped ratio must be
                taken against the policy that sampled, which is older than the actor's). They
                are those of the distribution sampled: temperature and top-p applied.

        Returns:
            A CPU batch of ``len(prompts) * n`` rows; ``None`` when the call was cancelled
            (``ray.cancel``: a partial rollout restarted with newer weights) before it ended.

        Raises:
            WorkerError: the weights held are older than ``expect_version``.
        """
        self._sync(weights, expect_version)
        with trace.span("generate", "rollout", self.device_labels):
            try:
                batch = sample_prompts(
                    self, prompts, step, with_logprobs=behaviour_logprobs, should_stop=_cancelled
                )
                if self.run.rollout.latency_ms:  # models a slower device (benchmarks, sweeps)
                    _sleep_unless_cancelled(self.run.rollout.latency_ms / 1000)
            except GenerationStopped:
                return None  # nobody reads a cancelled call's result
            return batch.to("cpu")

    def evaluate(self, weights: HostBuckets | None = None) -> float:
        """Greedy accuracy on the task's evaluation prompts, with the given weights."""
        self._sync(weights, None)
        if self._task is None:
            self._task = build_task(self.run.task, self.tokenizer)
        with trace.span("evaluate", "rollout", self.device_labels):
            return greedy_accuracy(
                self.model, self.tokenizer, self._task, self.run.rollout.max_new_tokens
            )


def _cancelled() -> bool:
    """Whether the Ray call running this code was cancelled (``ray.cancel`` on its ref).

    Ray only flags a running actor call; the call itself must look (between decoding steps).
    """
    import ray

    if not ray.is_initialized():
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
