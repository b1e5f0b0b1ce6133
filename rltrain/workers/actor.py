"""The actor: trains the policy, data-parallel across its processes (torch backend)."""

from __future__ import annotations

import os
from typing import Any

import torch

from rltrain.algorithms.update import UpdateSettings, add_advantages, ppo_update
from rltrain.backends.offload import StateMover
from rltrain.backends.weight_sync.host import HostBuckets, pack_to_host
from rltrain.config.schema import RunConfig
from rltrain.runners.sizes import BatchSizes
from rltrain.scheduler import Worker
from rltrain.tasks import build_model, build_tokenizer
from rltrain.telemetry import trace
from rltrain.workers.batching import concat_batches
from rltrain.workers.common import ResidentState, compute_device, seed_everything


def build_optimizer(model: torch.nn.Module, run: RunConfig) -> torch.optim.Optimizer:
    o = run.optimizer
    return torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
    )


class ActorWorker(Worker, ResidentState):
    """One data-parallel rank of the policy being trained.

    Args:
        run: the checked run config.
        sizes: the derived batch sizes (this rank trains ``sizes.samples_per_actor_rank`` rows).
    """

    def __init__(self, run: RunConfig, sizes: BatchSizes) -> None:
        seed_everything(run.seed)
        self.run, self.sizes = run, sizes
        self.settings = UpdateSettings.from_config(run)
        self.device = compute_device(self)
        self.tokenizer = build_tokenizer(run.model)
        self.model = build_model(run.model).to(self.device)
        self.optimizer = build_optimizer(self.model, run)
        self.mover = StateMover(self.model, self.optimizer, device=self.device)
        self.ddp: torch.nn.Module | None = None

    def setup_data_parallel(self) -> None:
        """Wrap the model for gradient all-reduce (after the group's process group exists)."""
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)

    def train(
        self,
        shard_refs: list[Any],
        rewards: list[torch.Tensor],
        step: int,
        ref_logprobs: list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """One update on this rank's slice of the step's batch.

        Args:
            shard_refs: object refs of the rollout shards (rank order), fetched here, not by
                the driver.
            rewards: one ``[b]`` reward tensor per shard.
            step: the policy-update index (seeds minibatch shuffling).
            ref_logprobs: ``[b, R]`` reference log-probs per shard (when the KL is on).

        Returns:
            Training metrics of this rank, plus ``state_bytes/<kind>`` for the ledger.
        """
        import ray

        with trace.span("train", "actor", self.device_labels):
            shards = ray.get(list(shard_refs))
            shards = [s.replace(rewards=r) for s, r in zip(shards, rewards, strict=True)]
            if ref_logprobs is not None:
                shards = [
                    s.replace(ref_logprobs=r) for s, r in zip(shards, ref_logprobs, strict=True)
                ]
            batch = add_advantages(
                concat_batches(shards, self.tokenizer.pad_token_id), self.settings
            )
            n = self.sizes.samples_per_actor_rank
            mine = batch.select(torch.arange(self.rank * n, (self.rank + 1) * n)).to(self.device)
            gen = torch.Generator().manual_seed(self.run.seed * 1_000_003 + step)
            metrics = ppo_update(
                self.ddp or self.model, self.optimizer, mine, self.settings, generator=gen
            )
        metrics.update({f"state_bytes/{k}": v for k, v in self.state_bytes().items()})
        return metrics

    def export_weights(self, version: int) -> HostBuckets:
        """Pack the current weights into host buckets for the rollout workers."""
        with trace.span("sync", "actor", self.device_labels):
            return pack_to_host(list(self.model.named_parameters()), version=version)

    # ------------------------------------------------------------------------- checkpoints
    def save(self, path: str) -> None:
        """Write the model (HF safetensors), tokenizer and optimizer into ``path`` (rank 0)."""
        if self.rank != 0:
            return
        with _local_dir(path) as local:
            self.model.save_pretrained(os.path.join(local, "model"), safe_serialization=True)
            self.tokenizer.save_pretrained(os.path.join(local, "model"))
            torch.save(self.optimizer.state_dict(), os.path.join(local, "optimizer.pt"))

    def load(self, path: str) -> None:
        """Restore model and optimizer from a checkpoint written by :meth:`save`."""
        from safetensors.torch import load_file

        with _fetched_dir(path) as local:
            state = load_file(os.path.join(local, "model", "model.safetensors"))
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if unexpected or [m for m in missing if "lm_head" not in m]:
                from rltrain.errors import ConfigError

                raise ConfigError(
                    f"trainer.resume checkpoint {path!r} does not match model.* (missing "
                    f"{missing[:3]}, unexpected {unexpected[:3]}): resume with the model config "
                    f"it was written with, or start fresh (trainer.resume=null)"
                )
            opt = torch.load(os.path.join(local, "optimizer.pt"), map_location=self.device)
            self.optimizer.load_state_dict(opt)


class _local_dir:
    """A local directory to write into; uploaded to ``path`` on exit when it is a remote URI."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.remote = "://" in path and not path.startswith("file://")

    def __enter__(self) -> str:
        if not self.remote:
            os.makedirs(self.path, exist_ok=True)
            return self.path
        import tempfile

        self._tmp = tempfile.TemporaryDirectory()
        return self._tmp.name

    def __exit__(self, *exc: object) -> None:
        if self.remote:
            if exc[0] is None:
                import fsspec

                fs, root = fsspec.core.url_to_fs(self.path)
                fs.put(self._tmp.name + "/", root, recursive=True)
            self._tmp.cleanup()


class _fetched_dir(_local_dir):
    """A local copy of ``path`` (downloaded first when it is a remote URI)."""

    def __enter__(self) -> str:
        local = super().__enter__()
        if self.remote:
            import fsspec

            fs, root = fsspec.core.url_to_fs(self.path)
            fs.get(root + "/", local, recursive=True)
        return local

    def __exit__(self, *exc: object) -> None:
        if self.remote:
            self._tmp.cleanup()
