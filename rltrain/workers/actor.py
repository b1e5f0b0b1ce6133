"""The actor: trains the policy, data-parallel across its processes.

The training engine (``actor.backend``: torch AdamW + DDP, or DeepSpeed ZeRO) sits behind
:class:`~rltrain.backends.training.TrainingEngine`; this worker owns the data (its slice of the
step's batch), the weight export, the checkpoints and the residency calls.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, add_advantages
from rltrain.backends.offload import release_cached_blocks
from rltrain.backends.training import StateSurface, TrainingEngine, build_dtype, build_engine
from rltrain.backends.weight_sync.host import pack_to_host
from rltrain.backends.weight_sync.transport import WeightSender
from rltrain.config.schema import RunConfig
from rltrain.config.seeds import minibatch_seed
from rltrain.errors import ConfigError
from rltrain.placement.sizes import BatchSizes
from rltrain.scheduler import Worker
from rltrain.tasks import build_tokenizer
from rltrain.tasks.model import build_model
from rltrain.telemetry import trace
from rltrain.workers.batching import concat_batches, with_scores
from rltrain.workers.common import (
    LOSS_TOKENS,
    ResidentState,
    TrainResult,
    compute_device,
    fetch,
    fetched_dir,
    load_rng_state,
    local_dir,
    memory_peaks,
    save_rng_state,
    seed_everything,
)


class ActorWorker(Worker, ResidentState):
    """One data-parallel rank of the policy being trained.

    Args:
        run: the checked run config.
        sizes: the derived batch sizes (this rank trains ``sizes.samples_per_actor_rank`` rows).

    Raises:
        ConfigError: for an ``actor.backend`` that cannot run with these settings.
    """

    def __init__(self, run: RunConfig, sizes: BatchSizes) -> None:
        seed_everything(run.seed)
        self.run, self.sizes = run, sizes
        self.settings = UpdateSettings.from_config(run)
        self.device = compute_device(self)
        self.tokenizer = build_tokenizer(run.model)
        self.engine: TrainingEngine = build_engine(
            run,
            build_model(run.model, dtype=build_dtype(run)),  # the engine casts to model.dtype
            self.device,
            micro_batch=sizes.micro_batch,
            minibatch=sizes.samples_per_minibatch,
        )
        self._senders: dict[str, WeightSender] = {}
        # a receiver in another process on this rank's device (the ipc transport): it allocates
        # next (a vLLM engine wakes), so an update gives its cached blocks back to the driver
        self._yields_device = False

    # The engine owns model, optimizer and state; properties keep them out of the worker's own
    # attributes, so the ledger's independent walk reaches each tensor through the engine only.
    @property
    def model(self) -> torch.nn.Module:
        """The plain policy model (DeepSpeed's ``engine.module`` once built)."""
        return self.engine.model

    @property
    def optimizer(self) -> Any:
        """The engine's optimizer (torch AdamW, or DeepSpeed's ZeRO optimizer)."""
        inner = getattr(self.engine, "optimizer", None)
        return inner if inner is not None else self.engine.actor.optimizer

    @property
    def mover(self) -> StateSurface:  # type: ignore[override]
        """The engine's state mover, driven by ``offload`` / ``reload``."""
        return self.engine.mover

    def setup_data_parallel(self) -> None:
        """Wrap the model for gradient all-reduce (after the group's process group exists)."""
        self.engine.setup(self.world_size)

    def train(
        self,
        *shards: Any,
        rewards: list[Any],
        step: int,
        ref_logprobs: list[torch.Tensor] | None = None,
        old_logprobs: list[torch.Tensor] | None = None,
        rows: torch.Tensor | None = None,
    ) -> TrainResult:
        """One update on this rank's slice of the step's batch.

        Args:
            shards: the rollout shards (shard order), each an object ref passed as its own
                argument (Ray resolves it before the call starts, small ones inline in the
                call, so the worker makes no extra round trip to fetch it) or a batch.
            rewards: one ``[b]`` reward tensor per shard, or the reward worker's
                :class:`~rltrain.workers.reward.Scores` per shard (its answer passed on as an
                object reference, so the driver need not wait for it).
            step: the policy-update index (seeds minibatch shuffling).
            ref_logprobs: ``[b, R]`` reference log-probs per shard (when the KL is on).
            old_logprobs: ``[b, R]`` behaviour log-probs per shard from the inference
                component (the actor then runs no forward pass of its own for them).
            rows: the training batch's rows within the shards joined in order (the runner's
                batch stage, e.g. ``algorithm.filter_groups``); None: every row.

        Returns:
            This rank's metrics and state sizes.
        """
        with trace.span("train", "actor", self.device_labels):
            scored = with_scores(fetch(shards), rewards, ref_logprobs, old_logprobs)
            batch = concat_batches(scored, self.tokenizer.pad_token_id)
            if rows is not None:
                batch = batch.select(rows)
            if self.settings.algorithm.kl_in == "reward":  # the advantages take the KL: every row's
                batch = self.own_reference(batch)
            batch = add_advantages(batch, self.settings)
            n = self.sizes.samples_per_actor_rank
            return self.update(batch.select(torch.arange(self.rank * n, (self.rank + 1) * n)), step)

    def update(self, mine: RolloutBatch, step: int) -> TrainResult:
        """One update on this rank's rows (advantages set), on any device.

        Args:
            mine: this rank's ``sizes.samples_per_actor_rank`` rows.
            step: the policy-update index (seeds minibatch shuffling).

        Returns:
            This rank's metrics and state sizes.
        """
        gen = torch.Generator().manual_seed(minibatch_seed(self.run.seed, step))
        memory_peaks(self.device, reset=True)
        metrics = self.engine.update(self.own_reference(mine.to(self.device)), gen)
        metrics[LOSS_TOKENS] = float(mine.token_mask.sum())
        metrics.update(memory_peaks(self.device))
        if self._yields_device:
            release_cached_blocks(self.device)
        if self.run.simulate.actor_latency_ms:  # a slower device (simulate.*)
            time.sleep(self.run.simulate.actor_latency_ms / 1000)
        return TrainResult(metrics, self.state_bytes())

    def own_reference(self, batch: RolloutBatch) -> RolloutBatch:
        """The batch with reference log-probs computed here when no reference component gave
        them: under LoRA the reference is the policy with its adapters disabled
        (:func:`~rltrain.backends.lora.reference_logprobs`). With ``algorithm.kl_in=reward``
        behaviour log-probs are filled too (the policy as it is, adapters on) when the batch
        has neither pi_old nor the rollout's. Unchanged without LoRA, without the KL, or when
        the log-probs are there."""
        s, a = self.settings, self.settings.algorithm
        if self.run.actor.lora.rank <= 0 or a.kl_coef <= 0 or batch.ref_logprobs is not None:
            return batch
        from rltrain.algorithms.update import behaviour_logprobs
        from rltrain.backends.lora import eval_mode, reference_logprobs

        on, home = batch.to(self.device), batch.response_mask.device
        micro = self.sizes.micro_batch
        if a.kl_in == "reward" and batch.old_logprobs is None and batch.rollout_logprobs is None:
            with eval_mode(self.model):  # no adapter dropout in behaviour log-probs
                old = behaviour_logprobs(self.model, on, s, micro)
            batch = batch.replace(old_logprobs=old.to(home))
        ref = reference_logprobs(self.model, on, s, micro)
        return batch.replace(ref_logprobs=ref.to(home))

    # ------------------------------------------------------------------------- weight sync
    def setup_weight_sync(self, choices: dict[str, Any]) -> None:
        """Take the transports the plan chose, one per receiving component.

        A rank that sends over CUDA IPC has its receiver in another process on its device
        (a collocated vLLM engine that wakes next): from now on it hands its cached blocks back
        to the driver at the end of each update (:func:`release_cached_blocks`).

        Args:
            choices: a ``TransportChoice`` per receiving component (``rollout``,
                ``inference``).
        """
        self._senders = {recv: WeightSender(choice, self.rank) for recv, choice in choices.items()}
        self._yields_device = any(
            c.name == "ipc" and self.rank in c.sources for c in choices.values()
        )

    def open_weight_sync(self) -> tuple[str, int]:
        """(collective source) The address and a free port for a sync group's store."""
        import ray

        from rltrain.scheduler.worker import free_port

        return ray.util.get_node_ip_address(), free_port()

    def join_weight_sync(
        self, receiver: str, host: str, port: int, world: int, timeout_s: float
    ) -> None:
        """(collective source) Open ``receiver``'s sync group as its rank 0."""
        self._senders[receiver].join(host, port, world, timeout_s)

    def export_weights(self, version: int, receiver: str | None = None) -> Any:
        """Start moving the current weights to ``receiver`` by its transport.

        Args:
            version: the weight version (the number of updates so far).
            receiver: the receiving component; None (or one without a transport set up): pack
                host buckets (the object-store path).

        Returns:
            What the driver hands the receivers: host buckets, this rank's IPC payload, or a
            collective version marker; None on a rank the transport does not send from.
        """
        sender = self._senders.get(receiver) if receiver is not None else None
        with trace.span("sync", "actor", self.device_labels):
            if sender is None:
                return pack_to_host(self.engine.named_weights(), version=version)
            if not sender.sends:
                return None
            return sender.export(self.engine.named_weights(), version)

    def release_weights(
        self, receiver: str, version: int | None = None, receiver_rank: int | None = None
    ) -> int:
        """(ipc) ``receiver_rank`` of ``receiver`` loaded ``version`` (a receiver calls this
        through the handle its payload carries): free the device buckets every receiver has
        loaded. With no version: free all of ``receiver``'s (the run ends).

        Returns:
            Device bytes freed.
        """
        if receiver not in self._senders:
            return 0
        return self._senders[receiver].release(version, receiver_rank)

    def transient_bytes(self) -> dict[str, int]:
        """Device bytes beside the engine's state (``weight_sync``): IPC buckets not yet loaded
        by every receiver, or the collective transport's snapshot (or bucket) on the device
        while its broadcast waits or runs."""
        return {"weight_sync": sum(s.device_bytes for s in self._senders.values())}

    def flush_weight_sync(self, timeout_s: float | None = None) -> None:
        """(collective) At the run's end: wait until every version queued for broadcast was
        taken, then stop the senders' background threads."""
        for sender in self._senders.values():
            sender.flush(timeout_s)
            sender.close()

    def memory_report(self) -> dict[str, Any]:
        """Ledger bytes vs the independent measure (see :class:`ResidentState`).

        Where the walk cannot tell offloaded from resident engine state (DeepSpeed on simulated
        devices offloads host to host, in place), the engine's bytes are taken from its own
        ledger and the walk checks everything the worker holds outside the engine.

        Raises:
            WorkerError: the worker holds device bytes its ledger does not declare.
        """
        if self.engine.walk_sees_offload:
            return super().memory_report()
        return self.memory_report_beside(
            self.engine, "training engine", "host-to-host offload on simulated devices"
        )

    # ------------------------------------------------------------------------- checkpoints
    def save(self, path: str) -> None:
        """Write the model (HF safetensors), tokenizer, optimizer and random states into
        ``path``; call it on every actor rank.

        Rank 0 writes the model and tokenizer; the optimizer state is written by rank 0 when
        it is replicated (torch/DDP) and by every rank, one shard each, when the engine
        partitions it (DeepSpeed ZeRO). Every rank writes its random states (``rng/``: the
        dropout draws of a resumed run continue where they stopped). Under LoRA ``model/``
        holds the base weights and ``adapter/`` the adapter in peft's format
        (:func:`~rltrain.backends.lora.save_checkpoint`).
        """
        gathered = self.engine.checkpoint_weights()  # ZeRO-3: a collective of every rank
        with local_dir(path) as local:
            save_rng_state(local, f"actor_rank{self.rank}", self.device)
            if self.rank == 0:
                if self.run.actor.lora.rank > 0:
                    from rltrain.backends.lora import save_checkpoint

                    save_checkpoint(self.model, local)
                else:
                    self.model.save_pretrained(
                        os.path.join(local, "model"), safe_serialization=True, state_dict=gathered
                    )
                self.tokenizer.save_pretrained(os.path.join(local, "model"))
            self.engine.save_optimizer(local, self.rank)

    def load(self, path: str) -> None:
        """Restore model, optimizer and this rank's random states from a checkpoint written
        by :meth:`save`.

        Raises:
            ConfigError: the checkpoint does not match ``model.*`` or the actor's layout.
        """
        with fetched_dir(path) as local:
            self._load_state(local, path)
            load_rng_state(local, f"actor_rank{self.rank}", self.device)

    def _load_state(self, local: str, path: str) -> None:
        """Model and optimizer from the local copy ``local`` of the checkpoint ``path``."""
        from safetensors.torch import load_file

        if self.run.actor.lora.rank > 0:
            from rltrain.backends.lora import load_checkpoint

            load_checkpoint(self.model, local, path)
            self.engine.load_optimizer(local, self.rank, self.world_size)
            return
        if os.path.isdir(os.path.join(local, "adapter")):
            raise ConfigError(
                f"trainer.resume checkpoint {path!r} holds a LoRA adapter (adapter/) but "
                f"actor.lora.rank=0: its model/ is the base without the adapter; resume "
                f"with the actor.lora settings it was written with"
            )
        state = load_file(os.path.join(local, "model", "model.safetensors"))
        with torch.no_grad():  # DeepSpeed's parameters are views of its flat buffers
            missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise ConfigError(
                f"trainer.resume checkpoint {path!r} does not match model.* (missing "
                f"{missing[:3]}, unexpected {unexpected[:3]}): resume with the model config "
                f"it was written with, or start fresh (trainer.resume=null)"
            )
        self.engine.load_optimizer(local, self.rank, self.world_size)
