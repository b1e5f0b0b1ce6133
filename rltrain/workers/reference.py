"""The reference policy: frozen initial weights, log-probs for the KL penalty."""

from __future__ import annotations

from typing import Any

import torch

from rltrain.algorithms.update import UpdateSettings, behaviour_logprobs
from rltrain.backends.offload import StateMover
from rltrain.config.schema import RunConfig
from rltrain.scheduler import Worker
from rltrain.tasks.model import build_model
from rltrain.telemetry import trace
from rltrain.workers.common import ResidentState, compute_device, fetch


def shards_of_rank(num_shards: int, rank: int, world_size: int) -> list[int]:
    """Shard indices a reference rank scores: round-robin, so ranks share the work evenly."""
    return list(range(rank, num_shards, world_size))


def gather_round_robin(per_rank: list[list[Any]], num_shards: int) -> list[Any]:
    """Undo :func:`shards_of_rank`: results back in shard order."""
    w = len(per_rank)
    return [per_rank[j % w][j // w] for j in range(num_shards)]


class ReferenceWorker(Worker, ResidentState):
    """Holds the initial policy, frozen.

    Optional under LoRA (``actor.lora.rank > 0``): the actor's base model with its adapters
    disabled is the same policy, and the actor computes the reference log-probs itself when no
    reference is placed (:meth:`~rltrain.workers.actor.ActorWorker.own_reference`).

    Args:
        run: the checked run config.
    """

    def __init__(self, run: RunConfig) -> None:
        self.run = run
        self.device = compute_device(self)
        self.model = build_model(run.model).to(self.device)
        self.model.requires_grad_(False)
        self.mover = StateMover(self.model, None, device=self.device)
        self.settings = UpdateSettings.from_config(run)

    @torch.no_grad()
    def logprobs(self, shard_refs: list[Any]) -> list[torch.Tensor]:
        """``[b, R]`` reference log-probs of this rank's shards (see :func:`shards_of_rank`),
        ``reference.micro_batch_size`` rows per forward pass, at the sampling temperature."""
        mine = shards_of_rank(len(shard_refs), self.rank, self.world_size)
        out = []
        with trace.span("reference", "reference", self.device_labels):
            for b in fetch([shard_refs[i] for i in mine]):
                lp = behaviour_logprobs(
                    self.model,
                    b.to(self.device),
                    self.settings,
                    micro_batch=self.run.reference.micro_batch_size,
                )
                out.append(lp.cpu())
        return out
