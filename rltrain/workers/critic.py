"""The critic: PPO's value model, data-parallel across its processes like the actor.

A :class:`~rltrain.algorithms.critic.ValueModel` (the policy's transformer with a scalar head,
built from ``model.*`` or loaded from ``model.path``) trained by a
:class:`~rltrain.backends.training.TorchValueEngine` (torch AdamW at ``critic.lr``, DDP over the
critic group's own process group, gradients accumulated over ``critic.micro_batch_size`` rows).

Per step the driver calls, on every critic rank:

1. :meth:`CriticWorker.with_values` — token values of the rollout shards, attached to the
   shards and put in the object store; the actor and the critic then read the same shards.
2. :meth:`CriticWorker.train` — token-level GAE on the whole step's batch (the reward on the
   last response token, the KL per token when ``algorithm.kl_in=reward``), then epochs x
   minibatches of the clipped value loss on this rank's rows.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from rltrain.algorithms.critic import ValueModel, compute_values
from rltrain.algorithms.update import UpdateSettings, add_advantages, micro_slices
from rltrain.backends.training import StateSurface, TorchValueEngine
from rltrain.config.schema import RunConfig
from rltrain.config.seeds import critic_minibatch_seed
from rltrain.errors import ConfigError
from rltrain.placement.sizes import CriticSizes
from rltrain.scheduler import Worker
from rltrain.tasks import build_tokenizer
from rltrain.tasks.model import build_model
from rltrain.telemetry import trace
from rltrain.workers.batching import concat_batches, with_scores
from rltrain.workers.common import (
    ResidentState,
    TrainResult,
    compute_device,
    fetch,
    fetched_dir,
    load_rng_state,
    local_dir,
    save_rng_state,
    seed_everything,
)
from rltrain.workers.reference import shards_of_rank

#: Where a checkpoint keeps the critic (beside the actor's ``model/`` and optimizer).
CHECKPOINT_SUBDIR = "critic"


def build_value_model(run: RunConfig) -> ValueModel:
    """The critic's value model: the policy's architecture and initial weights (``model.*`` or
    ``model.path``) without the LM head, plus a zero-initialised scalar head."""
    return ValueModel(build_model(run.model))


class CriticWorker(Worker, ResidentState):
    """One data-parallel rank of the PPO critic.

    Args:
        run: the checked run config.
        sizes: the critic's share of a step (the run layout's ``critic_sizes``).
    """

    def __init__(self, run: RunConfig, sizes: CriticSizes) -> None:
        seed_everything(run.seed)
        self.run = run
        self.sizes = sizes
        self.settings = UpdateSettings.from_config(run)
        self.device = compute_device(self)
        self.pad_token_id = build_tokenizer(run.model).pad_token_id
        self.engine = TorchValueEngine(
            run, build_value_model(run).to(self.device), self.device, self.sizes.micro_batch
        )

    @property
    def model(self) -> torch.nn.Module:
        """The plain value model (for checkpoints)."""
        return self.engine.model

    @property
    def mover(self) -> StateSurface:  # type: ignore[override]
        """The engine's state mover, driven by ``offload`` / ``reload``."""
        return self.engine.mover

    def setup_data_parallel(self) -> None:
        """Wrap the model for gradient all-reduce (after the group's process group exists)."""
        self.engine.setup(self.world_size)

    # --------------------------------------------------------------------------------- values
    @torch.no_grad()
    def values(self, shard_refs: list[Any]) -> list[torch.Tensor]:
        """``[b, R]`` token values of this rank's shards (round robin, see
        :func:`~rltrain.workers.reference.shards_of_rank`), zero outside each response mask.

        Args:
            shard_refs: object refs of the step's rollout shards, in rank order (or the
                batches themselves).

        Returns:
            One CPU tensor per shard this rank owns, in shard order.
        """
        mine = shards_of_rank(len(shard_refs), self.rank, self.world_size)
        with trace.span("values", "critic", self.device_labels):
            return [self._values(b) for b in fetch([shard_refs[i] for i in mine])]

    def with_values(self, shard_refs: list[Any]) -> list[Any]:
        """This rank's shards with their ``values`` set, put in the object store.

        The driver gathers the refs of all ranks back into shard order
        (:func:`~rltrain.workers.reference.gather_round_robin`) and hands them to the actor and
        the critic in place of the rollout's shards: the values never pass through the driver.

        Args:
            shard_refs: object refs of the step's rollout shards, in rank order.

        Returns:
            Object refs, one per shard this rank owns, in shard order.
        """
        import ray

        mine = shards_of_rank(len(shard_refs), self.rank, self.world_size)
        out = []
        with trace.span("values", "critic", self.device_labels), torch.no_grad():
            for b in fetch([shard_refs[i] for i in mine]):
                out.append(ray.put(b.replace(values=self._values(b))))
        return out

    def _values(self, batch: Any) -> torch.Tensor:
        """Values of one shard, ``micro_batch`` rows per forward."""
        self.model.eval()
        b = batch.to(self.device)
        parts = []
        for idx in micro_slices(b.size, self.sizes.micro_batch):
            m = b.select(idx)
            parts.append(compute_values(self.model, m.input_ids, m.attention_mask, m.response_mask))
        return torch.cat(parts).cpu()

    # ---------------------------------------------------------------------------------- train
    def train(
        self,
        *shards: Any,
        rewards: list[Any],
        step: int,
        ref_logprobs: list[torch.Tensor] | None = None,
    ) -> TrainResult:
        """One value update on this rank's rows of the step's batch.

        Args:
            shards: the shards with values (from :meth:`with_values`), shard order, each an
                object ref passed as its own argument (resolved by Ray) or a batch.
            rewards: one ``[b]`` reward tensor per shard, or the reward worker's ``Scores`` per
                shard (as the actor takes them).
            step: the update index (seeds minibatch shuffling).
            ref_logprobs: ``[b, R]`` reference log-probs per shard (KL in the reward).

        Returns:
            This rank's metrics (``critic/value_loss``, ``critic/grad_norm``,
            ``critic/values_mean``, ``critic/returns_mean``) and state sizes.

        Raises:
            ConfigError: the shards carry no values, or ``algorithm.advantage_estimator`` is
                not ``gae``.
        """
        with trace.span("train", "critic", self.device_labels):
            scored = with_scores(fetch(shards), rewards, ref_logprobs)
            if any(s.values is None for s in scored):
                raise ConfigError(
                    "critic.train got rollout shards without values: pass the refs returned by "
                    "CriticWorker.with_values"
                )
            batch = add_advantages(concat_batches(scored, self.pad_token_id), self.settings)
            if batch.returns is None:
                raise ConfigError(
                    f"algorithm.advantage_estimator="
                    f"{self.settings.algorithm.advantage_estimator!r} gives "
                    f"no value targets: the critic trains with gae only"
                )
            n = self.sizes.samples_per_rank
            mine = batch.select(torch.arange(self.rank * n, (self.rank + 1) * n)).to(self.device)
            gen = torch.Generator().manual_seed(critic_minibatch_seed(self.run.seed, step))
            metrics = self.engine.update(mine, gen)
            mask = mine.response_mask.float()
            tokens = mask.sum().clamp(min=1.0)
            metrics["critic/values_mean"] = float((mine.values * mask).sum() / tokens)
            metrics["critic/returns_mean"] = float((mine.returns * mask).sum() / tokens)
        return TrainResult(metrics, self.state_bytes())

    # ---------------------------------------------------------------------------- checkpoints
    def save(self, path: str) -> None:
        """Write the value model (safetensors) and its optimizer under ``path/critic`` (rank 0;
        DDP replicates both) and every rank's random states (``critic/rng/``: the dropout of a
        value model loaded from ``model.path`` draws after a resume what it would have drawn)."""
        from safetensors.torch import save_file

        with local_dir(os.path.join(path, CHECKPOINT_SUBDIR)) as local:
            save_rng_state(local, f"critic_rank{self.rank}", self.device)
            if self.rank != 0:
                return
            state = {k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()}
            save_file(state, os.path.join(local, "model.safetensors"))
            self.engine.save_optimizer(local, 0)

    def load(self, path: str) -> None:
        """Restore the value model and optimizer written by :meth:`save`.

        Raises:
            ConfigError: the checkpoint has no critic, or one of another model.
        """
        from safetensors.torch import load_file

        with fetched_dir(os.path.join(path, CHECKPOINT_SUBDIR)) as local:
            file = os.path.join(local, "model.safetensors")
            if not os.path.isfile(file):
                raise ConfigError(
                    f"trainer.resume checkpoint {path!r} holds no critic ({file} is missing): it "
                    f"was written by a run without one; start fresh (trainer.resume=null)"
                )
            state = load_file(file)
            try:
                with torch.no_grad():
                    missing, unexpected = self.model.load_state_dict(state, strict=False)
                problem = f"missing {missing[:3]}, unexpected {unexpected[:3]}"
            except RuntimeError as exc:  # same names, other shapes
                missing, unexpected, problem = [""], [], str(exc).splitlines()[0]
            if missing or unexpected:
                raise ConfigError(
                    f"trainer.resume checkpoint {path!r} holds a critic of another model "
                    f"({problem}): resume with the model.* it was written with, or start fresh "
                    f"(trainer.resume=null)"
                )
            self.engine.load_optimizer(local, self.rank, self.world_size)
            load_rng_state(local, f"critic_rank{self.rank}", self.device)
