"""The inference component: the rollout's log-probs under the current policy, on its own devices.

As in RLinf's disaggregated mode, a placed ``inference`` component (``+placement.
component_placement.inference=...``) takes the actor's weights like the rollout does (through the
transport the plan chose for it) and recomputes, for every rollout shard of a step, the
per-token log-probs of the sampled responses under the policy that sampled them. The actor then
trains against those ``old_logprobs`` instead of running that forward pass itself, so the
log-prob pass runs on the inference devices while the actor's devices are free.
"""

from __future__ import annotations

from typing import Any

import torch

from rltrain.algorithms.update import UpdateSettings, behaviour_logprobs
from rltrain.backends.generation import TorchReceiver
from rltrain.config.schema import RunConfig
from rltrain.scheduler import Worker
from rltrain.telemetry import trace
from rltrain.workers.common import ResidentState, WeightReceiver, compute_device, fetch
from rltrain.workers.reference import shards_of_rank


class InferenceWorker(Worker, WeightReceiver, ResidentState):
    """Holds a copy of the policy (no optimizer) and computes behaviour log-probs.

    Args:
        run: the checked run config.
    """

    def __init__(self, run: RunConfig) -> None:
        self.run = run
        self.device = compute_device(self)
        self.engine = TorchReceiver(run, self.device)
        self.settings = UpdateSettings.from_config(run)
        self.version = -1

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.model

    @property
    def mover(self) -> Any:  # type: ignore[override]
        return self.engine.mover

    @torch.no_grad()
    def logprobs(
        self, shard_refs: list[Any], weights: Any = None, expect_version: int | None = None
    ) -> list[torch.Tensor]:
        """``[b, R]`` log-probs of this rank's shards (round-robin, see ``shards_of_rank``).

        Args:
            shard_refs: every rollout shard of the step (object refs or batches), shard order.
            weights: the weights handed over (the version the rollout sampled with).
            expect_version: refuse older weights than this.

        Returns:
            One CPU tensor per shard this rank computed, in its shard order; computed
            ``inference.micro_batch_size`` rows at a time, at the sampling temperature.
        """
        self._sync(weights, expect_version)
        mine = shards_of_rank(len(shard_refs), self.rank, self.world_size)
        out = []
        with trace.span("inference", "inference", self.device_labels):
            for b in fetch([shard_refs[i] for i in mine]):
                lp = behaviour_logprobs(
                    self.model,
                    b.to(self.device),
                    self.settings,
                    micro_batch=self.run.inference.micro_batch_size,
                )
                out.append(lp.cpu())
        return out
