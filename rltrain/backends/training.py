"""Training engines: what trains the actor's policy, behind one small protocol.

The actor worker owns the data (its slice of the step's batch), the checkpoints and the
residency calls; a :class:`TrainingEngine` owns the model, the optimizer and the update:

- :class:`TorchEngine` (``actor.backend=torch``): torch AdamW (over fp32 master weights when
  ``model.dtype`` is 16-bit: :mod:`~rltrain.backends.precision`), DistributedDataParallel over
  the actor group's default process group (gradients averaged through shared memory between CPU
  ranks of one host, :mod:`~rltrain.backends.host_allreduce`),
  :func:`~rltrain.algorithms.update.ppo_update` with each minibatch's gradient accumulated over
  micro-batches of ``actor.micro_batch_size`` rows, or of at most
  ``actor.max_tokens_per_micro_batch`` padded tokens when that is set.
- :class:`TorchValueEngine`: the same for the PPO critic's value model (``critic.lr``,
  :func:`~rltrain.algorithms.update.value_update`).
- :class:`DeepSpeedEngine` (``actor.backend=deepspeed``): a
  :class:`~rltrain.backends.deepspeed_engine.DeepSpeedActor` (ZeRO 1/2/3) built over the same
  process group, running the same epochs x minibatches of
  :func:`~rltrain.algorithms.update.actor_loss`, with ``actor.micro_batch_size`` micro-batches
  accumulated by DeepSpeed (or token-budget micro-batches, the ranks agreeing on their number).

Both honour ``optimizer.warmup_steps`` (a linear learning-rate warmup over the first optimizer
steps, :func:`build_warmup`) and ``actor.gradient_checkpointing`` (activations of each decoder
layer recomputed in the backward pass, :func:`enable_gradient_checkpointing`).

With ``actor.lora.rank > 0`` :func:`build_engine` wraps the policy with LoRA adapters first
(:mod:`~rltrain.backends.lora`): either engine then trains and hands the optimizer the adapters
only, and ``named_weights`` exports the merged weights under the plain names.

Both expose the state-mover surface (``offload`` / ``reload`` / ``resident_bytes`` /
``host_bytes`` / ``offloaded``) as ``engine.mover``, which the worker's residency methods drive.
"""

from __future__ import annotations

import glob
import math
import os
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Protocol

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.logprobs import LogprobGap, compute_logprobs
from rltrain.algorithms.update import (
    UpdateSettings,
    actor_loss,
    behaviour_logprobs,
    micro_weights,
    ppo_update,
    split_rows,
    trim_padding,
    update_minibatches,
    value_update,
    with_old_logprobs,
)
from rltrain.backends.host_allreduce import data_parallel_ranks, wrap_data_parallel
from rltrain.backends.lora import eval_mode, is_lora, merged_weights, wrap_lora
from rltrain.backends.offload import StateMover
from rltrain.backends.precision import (
    LossScale,
    MasterWeightOptimizer,
    needs_loss_scale,
    needs_masters,
)
from rltrain.backends.warmup import (  # noqa: F401  (re-exported: callers read them here)
    build_warmup,
    optimizer_steps,
    resume_warmup,
    save_warmup,
    saved_warmup_steps,
    warmup_factor,
)
from rltrain.config import resolve_offload
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, WorkerError
from rltrain.kinds import registry
from rltrain.kinds.records import load
from rltrain.tasks.model import resolve_dtype

#: The environment variable DeepSpeed's JIT builds cache their compiled ops under.
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"


class StateSurface(Protocol):
    """What the residency interface calls on an engine's state (a ``StateMover`` has it)."""

    @property
    def offloaded(self) -> frozenset[str]: ...

    def offload(self, kinds: Iterable[str]) -> int: ...

    def reload(self, kinds: Iterable[str] | None = None) -> int: ...

    def resident_bytes(self) -> dict[str, int]: ...

    def host_bytes(self) -> dict[str, int]: ...


class TrainingEngine(Protocol):
    """The policy's training engine, as the actor worker uses it.

    Attributes:
        device: the device the engine computes on.
        model: the plain (unwrapped) Hugging Face model, for checkpoints.
        mover: the state-mover surface the residency interface drives.
        sharded_optimizer: True when each rank holds only its part of the optimizer state (so
            every rank writes and reads its own file in a checkpoint).
        walk_sees_offload: True when walking the worker's tensors tells resident state from
            offloaded state (False for DeepSpeed on CPU, whose offload is host-to-host in place).
    """

    device: torch.device
    model: torch.nn.Module
    mover: StateSurface
    sharded_optimizer: bool
    walk_sees_offload: bool

    def setup(self, world_size: int) -> None:
        """Wrap for data parallelism, once the group's default process group exists."""

    def update(self, batch: RolloutBatch, generator: torch.Generator) -> dict[str, float]:
        """Epochs x minibatches of the actor loss on this rank's batch; returns mean metrics."""

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The full weights, named as the model's ``named_parameters`` (for weight sync)."""

    def save_optimizer(self, directory: str, rank: int) -> None:
        """Write this rank's optimizer state into ``directory``."""

    def load_optimizer(self, directory: str, rank: int, world_size: int) -> None:
        """Read this rank's optimizer state from ``directory`` (written by ``save_optimizer``)."""

    def checkpoint_weights(self) -> dict[str, torch.Tensor] | None:
        """The model's weights for its checkpoint when its parameters do not hold them
        (ZeRO-3 partitions them: gathered, on rank 0; every rank must call it), else None
        (``save_pretrained`` reads the parameters)."""


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (``actor.
    gradient_checkpointing``): only the layers' inputs are kept from the forward pass.

    Non-reentrant checkpointing: gradients equal those without it, it needs no input that
    requires grad, and it works under DDP and DeepSpeed ZeRO.
    """
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5.20 (the old name warns)
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def build_adamw(
    model: torch.nn.Module, run: RunConfig, lr: float | None = None
) -> torch.optim.Optimizer:
    """torch AdamW over the model's trainable parameters with the ``optimizer.*`` settings
    (under LoRA the adapters only: the frozen base gets no optimizer state).

    Args:
        model: the model.
        run: the run config.
        lr: overrides ``optimizer.lr`` (the critic's ``critic.lr``).
    """
    o = run.optimizer
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=o.lr if lr is None else lr,
        betas=tuple(o.betas),
        eps=o.eps,
        weight_decay=o.weight_decay,
    )


def build_optimizer(
    model: torch.nn.Module,
    run: RunConfig,
    lr: float | None = None,
    initial: dict[torch.nn.Parameter, torch.Tensor] | None = None,
) -> Any:
    """The optimizer a torch engine steps: torch AdamW over the trained parameters, over fp32
    master copies of them when they are 16-bit (:mod:`~rltrain.backends.precision`; fp16 with
    dynamic loss scaling).

    Args:
        model: the model, in its compute dtype (``model.dtype``).
        run: the run config.
        lr: overrides ``optimizer.lr`` (the critic's ``critic.lr``).
        initial: fp32 values the masters start from, by parameter (see :class:`TorchEngine`).

    Returns:
        A ``torch.optim.AdamW``, or a :class:`~rltrain.backends.precision.MasterWeightOptimizer`.
    """
    if not needs_masters(model):
        return build_adamw(model, run, lr)
    o = run.optimizer

    def adamw(masters: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            masters,
            lr=o.lr if lr is None else lr,
            betas=tuple(o.betas),
            eps=o.eps,
            weight_decay=o.weight_decay,
        )

    trained = [p for p in model.parameters() if p.requires_grad]
    scale = LossScale() if needs_loss_scale(model) else None
    return MasterWeightOptimizer(trained, adamw, loss_scale=scale, initial=initial)


def build_dtype(run: RunConfig) -> str:
    """The dtype the actor's model is built in: float32 for an engine with ``fp32_masters``
    (the torch engine keeps the unrounded values as its fp32 masters and casts the model to
    ``model.dtype`` itself: :class:`TorchEngine`'s ``compute_dtype``); ``model.dtype`` for the
    others (DeepSpeed casts the model and makes its masters from the cast weights)."""
    return "float32" if registry.training_engine(run).fp32_masters else run.model.dtype


def build_engine(
    run: RunConfig, model: torch.nn.Module, device: torch.device, micro_batch: int, minibatch: int
) -> TrainingEngine:
    """The engine ``actor.backend`` names.

    Args:
        run: the checked run config.
        model: the freshly built policy (on ``device`` for torch; DeepSpeed moves it itself).
        device: this process's compute device.
        micro_batch: sequences per forward/backward (``BatchSizes.micro_batch``).
        minibatch: sequences per optimizer step on this rank (``BatchSizes.samples_per_minibatch``).

    Raises:
        ConfigError: for an unknown backend or settings DeepSpeed cannot run.
    """
    if run.actor.lora.rank > 0:  # adapters only train (rltrain.backends.lora)
        model = wrap_lora(model, run.actor.lora)
    kind = registry.training_engine(run)  # ConfigError for a name no engine has
    return load(kind.runtime)(run, model, device, micro_batch, minibatch)


def torch_engine(
    run: RunConfig, model: torch.nn.Module, device: torch.device, micro_batch: int, minibatch: int
) -> TorchEngine:
    """The torch engine (its entry's runtime in :mod:`rltrain.kinds.engines`); ``minibatch``
    is not needed: the update splits each minibatch into micro-batches itself."""
    return TorchEngine(
        run,
        model.to(device),
        device,
        micro_batch,
        checkpointing=run.actor.gradient_checkpointing,
        max_tokens=run.actor.max_tokens_per_micro_batch,
        compute_dtype=resolve_dtype(run.model.dtype),
    )


# ----------------------------------------------------------------------------------- torch
class TorchEngine:
    """torch AdamW + DDP + :func:`ppo_update` (the CPU default).

    Args:
        run: the checked run config.
        model: the policy, on ``device``.
        device: the compute device.
        micro_batch: rows per forward/backward; each minibatch's gradient is accumulated over
            its micro-batches (all-reduced once, on the last), so the step equals the one-shot
            step on the whole minibatch. ``<= 0``: each minibatch at once.
        lr: overrides ``optimizer.lr``.
        checkpointing: recompute activations in the backward pass (``actor.
            gradient_checkpointing``).
        max_tokens: padded tokens per forward/backward (``actor.max_tokens_per_micro_batch``)
            instead of ``micro_batch`` rows; None: rows.
        compute_dtype: cast the model to this dtype (``model.dtype``) after taking its fp32
            trained weights as the optimizer's masters, so they start unrounded; None: the
            model trains in the dtype it comes in (16-bit parameters then get masters copied
            from their rounded values).
    """

    sharded_optimizer = False
    walk_sees_offload = True
    #: The metric the learning rate of an update's first optimizer step is logged under.
    lr_metric = "actor/lr"

    def __init__(
        self,
        run: RunConfig,
        model: torch.nn.Module,
        device: torch.device,
        micro_batch: int = 0,
        lr: float | None = None,
        checkpointing: bool = False,
        max_tokens: int | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        self.settings = UpdateSettings.from_config(run)
        self.cluster = run.cluster
        self.device = device
        self.model = model
        self.micro_batch = micro_batch
        self.max_tokens = max_tokens
        if checkpointing:
            enable_gradient_checkpointing(model)
        start = None
        if compute_dtype is not None and compute_dtype != torch.float32:
            # The fp32 weights stay referenced here (no copy) while the cast gives the
            # parameters new 16-bit storages: they become the masters.
            start = {
                p: p.detach()
                for p in model.parameters()
                if p.requires_grad and p.dtype == torch.float32
            }
            model.to(compute_dtype)
        self.optimizer = build_optimizer(model, run, lr, initial=start)
        # The warmup acts on the torch optimizer's groups (the masters' under mixed precision).
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        self.scheduler = build_warmup(inner, run.optimizer.warmup_steps)
        self.mover = StateMover(model, self.optimizer, device=device)
        self.ddp: torch.nn.Module | None = None

    def setup(self, world_size: int) -> None:
        if world_size > 1:
            self.ddp = wrap_data_parallel(
                self.model,
                self.device,
                self.cluster.collective_timeout_s,
                host_allreduce=self.cluster.host_allreduce,
            )

    #: The update this engine runs (the critic's engine runs :func:`value_update`).
    update_fn = staticmethod(ppo_update)

    def update(self, batch: RolloutBatch, generator: torch.Generator) -> dict[str, float]:
        lr = float(self.optimizer.param_groups[0]["lr"])
        metrics = self.update_fn(
            self.ddp or self.model,
            self.optimizer,
            batch,
            self.settings,
            generator=generator,
            micro_batch=self.micro_batch,
            scheduler=self.scheduler,
            max_tokens=self.max_tokens,
            ranks=None if self.ddp is None else data_parallel_ranks(self.device),
        )
        metrics[self.lr_metric] = lr
        scale = getattr(self.optimizer, "loss_scale", None)
        if scale is not None:  # fp16: the dynamic loss scale after the update
            metrics[self.lr_metric.replace("/lr", "/loss_scale")] = scale.scale
        return metrics

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        if is_lora(self.model):  # receivers hold plain models: W + (alpha/r)·B@A, plain names
            return merged_weights(self.model)
        return list(self.model.named_parameters())

    def save_optimizer(self, directory: str, rank: int) -> None:
        if rank == 0:  # replicated by DDP: one copy is the whole state
            torch.save(self.optimizer.state_dict(), os.path.join(directory, "optimizer.pt"))
            save_warmup(self.scheduler, directory)

    def load_optimizer(self, directory: str, rank: int, world_size: int) -> None:
        state = torch.load(os.path.join(directory, "optimizer.pt"), map_location=self.device)
        self.optimizer.load_state_dict(state)
        resume_warmup(self.scheduler, saved_warmup_steps(directory, self.optimizer))

    def checkpoint_weights(self) -> dict[str, torch.Tensor] | None:
        return None  # the parameters hold the whole model on every rank


class TorchValueEngine(TorchEngine):
    """The PPO critic's engine: a value model trained by :func:`value_update` (torch AdamW at
    ``critic.lr``, DDP over the critic group's process group, micro-batch accumulation).

    Args:
        run: the checked run config.
        model: the :class:`~rltrain.algorithms.critic.ValueModel`, on ``device``.
        device: the compute device.
        micro_batch: rows per forward/backward (``critic.micro_batch_size``, at most a
            minibatch).
    """

    def __init__(
        self, run: RunConfig, model: torch.nn.Module, device: torch.device, micro_batch: int = 0
    ) -> None:
        super().__init__(run, model, device, micro_batch, lr=run.critic.lr)

    update_fn = staticmethod(value_update)
    lr_metric = "critic/lr"


# ------------------------------------------------------------------------------- deepspeed
def deepspeed_settings(run: RunConfig, micro_batch: int = 1, minibatch: int = 1) -> Any:
    """The :class:`DeepSpeedSettings` of a run.

    Args:
        run: the run config.
        micro_batch: sequences per forward/backward.
        minibatch: sequences per optimizer step on one rank; DeepSpeed accumulates
            ``ceil(minibatch / micro_batch)`` micro-batches per step (one per ``train_step``
            under ``actor.max_tokens_per_micro_batch``: :class:`DeepSpeedEngine` then marks
            the accumulation boundary itself, the number of micro-batches varying by step).
    """
    from rltrain.backends.deepspeed_engine import DeepSpeedSettings

    o, a = run.optimizer, run.actor
    accum = max(1, math.ceil(minibatch / max(micro_batch, 1)))
    return DeepSpeedSettings(
        zero_stage=a.zero_stage,
        dtype=run.model.dtype,
        optimizer=o.name,
        lr=o.lr,
        betas=(float(o.betas[0]), float(o.betas[1])),
        eps=o.eps,
        weight_decay=o.weight_decay,
        grad_clip=o.grad_clip,
        micro_batch_size=micro_batch,
        grad_accum_steps=1 if a.max_tokens_per_micro_batch is not None else accum,
        tensor_parallel_size=a.tensor_parallel_size,
        pipeline_parallel_size=a.pipeline_parallel_size,
        policy=resolve_offload(run.placement.offload.get("actor"), "placement.offload.actor"),
        warmup_steps=o.warmup_steps,
    )


def check_training_backend(run: RunConfig, on_gpu: bool | None = None) -> None:
    """Refuse, before Ray starts, actor settings the chosen training engine cannot run.

    Args:
        run: the run config.
        on_gpu: whether the actor will run on CUDA; None guesses: a cluster to join may have GPUs
            (the worker checks again on its device), a local one has them when this machine does.

    Raises:
        ConfigError: naming the keys (``actor.zero_stage``, ``optimizer.name``, ...) and the fix.
    """
    if run.actor.backend != "deepspeed":
        return
    from rltrain.backends.deepspeed_engine import check_deepspeed_limits, import_deepspeed

    if on_gpu is None:
        on_gpu = run.cluster.address is not None or torch.cuda.is_available()
    check_deepspeed_limits(deepspeed_settings(run), on_gpu=on_gpu)
    import_deepspeed()


def check_training_plan(run: RunConfig, plan: Any) -> None:
    """:func:`check_training_backend` as the DeepSpeed entry's pre-Ray check
    (:mod:`rltrain.kinds.engines`), and what the plan decides: ZeRO-3 over several actor
    ranks is refused (its gathered weight export is a collective of every rank, while the
    weight sync asks only the ranks that send; that path has not run on GPUs).

    Raises:
        ConfigError: as :func:`check_training_backend`, or ZeRO-3 on several actor ranks.
    """
    check_training_backend(run)
    ranks = plan.world_size("actor") if plan is not None and "actor" in plan.components else 1
    if run.actor.zero_stage == 3 and ranks > 1:
        raise ConfigError(
            f"actor.zero_stage=3 with {ranks} actor ranks: a ZeRO-3 weight export gathers every "
            f"layer from all ranks, but the weight sync asks only the ranks "
            f"that send; use actor.zero_stage=2 (optimizer states and gradients partitioned), "
            f"or one actor rank"
        )


def apply_extensions_dir(run: RunConfig) -> None:
    """Point DeepSpeed's JIT cache where the driver said, before DeepSpeed is imported.

    A worker inherits the driver's environment only when the driver started Ray; on a joined or
    already running Ray, ``cluster.runtime_env.env_vars.TORCH_EXTENSIONS_DIR`` is read here.
    """
    env_vars = (run.cluster.runtime_env or {}).get("env_vars") or {}
    value = env_vars.get(EXTENSIONS_ENV)
    if value and not os.environ.get(EXTENSIONS_ENV):
        os.environ[EXTENSIONS_ENV] = str(value)


class DeepSpeedEngine:
    """The policy trained by DeepSpeed (ZeRO 1/2/3), built once the process group exists.

    Args:
        run: the checked run config.
        model: the policy (DeepSpeed moves it to its device and dtype).
        device: the compute device.
        micro_batch: sequences per forward/backward.
        minibatch: sequences per optimizer step on this rank.

    Raises:
        ConfigError: for settings DeepSpeed cannot run (checked here, before any build).
    """

    def __init__(
        self,
        run: RunConfig,
        model: torch.nn.Module,
        device: torch.device,
        micro_batch: int,
        minibatch: int,
    ) -> None:
        from rltrain.backends.deepspeed_engine import check_deepspeed_limits

        self.settings = UpdateSettings.from_config(run)
        self.max_tokens = run.actor.max_tokens_per_micro_batch
        self.ds_settings = deepspeed_settings(run, micro_batch, minibatch)
        check_deepspeed_limits(self.ds_settings, on_gpu=device.type == "cuda")
        apply_extensions_dir(run)
        if run.actor.gradient_checkpointing:
            enable_gradient_checkpointing(model)  # DeepSpeed runs the module's own forward
        self.device = device
        self._model: torch.nn.Module | None = model
        self._actor: Any = None

    @property
    def sharded_optimizer(self) -> bool:
        return self.ds_settings.zero_stage > 0

    @property
    def walk_sees_offload(self) -> bool:
        # On CPU DeepSpeed's offload copies host to host and leaves the tensors reachable.
        return self.device.type == "cuda"

    @property
    def actor(self) -> Any:
        """The DeepSpeed actor (built at :meth:`setup`)."""
        if self._actor is None:
            raise WorkerError(
                "actor.backend=deepspeed: the DeepSpeed engine is built in "
                "setup_data_parallel(), after group.init_process_group(); call them first"
            )
        return self._actor

    @property
    def model(self) -> torch.nn.Module:
        return self._actor.module if self._actor is not None else self._model

    @property
    def mover(self) -> StateSurface:
        return self.actor

    def setup(self, world_size: int) -> None:
        from rltrain.backends.deepspeed_engine import DeepSpeedActor

        if self._actor is not None:
            return
        if world_size > 1 and not torch.distributed.is_initialized():
            raise WorkerError(
                "actor.backend=deepspeed with several actor ranks needs the group's process "
                "group: call group.init_process_group() before setup_data_parallel()"
            )
        if self.device.type == "cuda":
            # DeepSpeed picks cuda:LOCAL_RANK; the runtime isolates each process to its own
            # devices, so the right index is the worker's, not its rank on the node.
            os.environ["LOCAL_RANK"] = str(self.device.index)
            torch.cuda.set_device(self.device)
        self._actor = DeepSpeedActor(self._model, self.ds_settings)
        self._model = None  # DeepSpeed owns it now (engine.module)

    def update(self, batch: RolloutBatch, generator: torch.Generator) -> dict[str, float]:
        s, actor = self.settings, self.actor
        batch, known, gap = with_old_logprobs(batch, s, self._logprobs)
        sums: dict[str, float] = defaultdict(float)
        lr = float(actor.engine.get_lr()[0])
        ranks = data_parallel_ranks(self.device)
        plan = update_minibatches(batch, s, generator, s.algorithm.loss_agg, ranks)
        for steps, (idx, share) in enumerate(plan):
            first = gap if steps == 0 else None  # the weights before the update
            for k, v in self._step(batch.select(idx), first, share).items():
                sums[k] += v
        out = {k: v / len(plan) for k, v in sums.items()}
        out.update(known)
        if gap is not None:
            out.update(gap.metrics())
        out["actor/lr"] = lr
        return out

    def _logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, R]`` log-probs under the engine's weights now (pi_old's recompute), in eval
        mode as :func:`behaviour_logprobs` (no adapter dropout); the mode is restored after."""
        s, engine = self.settings, self.actor.engine
        if self.max_tokens is not None:
            parts = self._agreed_parts(batch)
            return behaviour_logprobs(engine, batch, s, 0, self.max_tokens, parts)
        with torch.no_grad(), eval_mode(engine):
            return compute_logprobs(
                engine,
                batch.input_ids,
                batch.attention_mask,
                batch.response_mask,
                temperature=s.temperature,
            )

    def _agreed_parts(self, mb: RolloutBatch) -> int:
        """Token-budget micro-batches every rank runs on its minibatch: the most any rank needs.

        ZeRO-2 reduces gradients in every backward pass and ZeRO-3 gathers weights in every
        forward pass, so all ranks must take the same number of passes.
        """
        parts = len(split_rows(mb, max_tokens=self.max_tokens))
        dist = torch.distributed
        if dist.is_initialized() and dist.get_world_size() > 1:
            most = torch.tensor([parts], device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            parts = int(most.item())
        return parts

    def _budget_step(
        self, mb: RolloutBatch, gap: LogprobGap | None = None, share: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step over micro-batches of ``actor.max_tokens_per_micro_batch`` tokens.

        The engine was built to accumulate one micro-batch per step (so it scales no loss);
        marking the boundary before each micro-batch makes it accumulate over all of them and
        step the optimizer after the last. Each loss weighs its share of the minibatch
        (:func:`micro_weights`), so the step equals the one-shot step; ``share`` is this rank's
        share of it over the ranks (:func:`rank_token_shares`).
        """
        parts = split_rows(mb, max_tokens=self.max_tokens, min_parts=self._agreed_parts(mb))
        weights = micro_weights(mb.token_mask, parts, self.settings.algorithm.loss_agg)
        sums: dict[str, float] = defaultdict(float)
        for i, (part, w) in enumerate(zip(parts, weights, strict=True)):

            def loss_fn(engine: torch.nn.Module, micro: RolloutBatch, w: float = w) -> torch.Tensor:
                loss, metrics = actor_loss(engine, micro, self.settings, gap)
                for k, v in metrics.items():
                    sums[k] += w * v
                return loss * (w * share)

            self.actor.engine.set_gradient_accumulation_boundary(i == len(parts) - 1)
            self.actor.train_step([trim_padding(mb.select(part))], loss_fn)
        out = dict(sums)
        norm = self.actor.engine.get_global_grad_norm()
        if norm is not None:
            out["actor/grad_norm"] = float(norm)
        return out

    def _step(
        self, mb: RolloutBatch, gap: LogprobGap | None = None, share: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step over the minibatch, split into the configured micro-batches
        (``gap`` counts their log-probs against the rollout's: the update's first step;
        ``share``: this rank's share of the minibatch over the ranks, :func:`rank_token_shares`)."""
        if self.max_tokens is not None:
            return self._budget_step(mb, gap, share)
        parts = torch.tensor_split(torch.arange(mb.size), self.ds_settings.grad_accum_steps)
        seen: list[dict[str, float]] = []
        # DeepSpeed divides every micro-batch's loss by their number; a token-mean loss must
        # weigh each by its share of the minibatch's tokens instead, so the step equals the
        # one-shot step (as the torch engine's accumulation does).
        n = len(parts)
        weights = micro_weights(mb.token_mask, list(parts), self.settings.algorithm.loss_agg)
        scale = iter(w * n * share for w in weights)

        def loss_fn(engine: torch.nn.Module, micro: RolloutBatch) -> torch.Tensor:
            loss, metrics = actor_loss(engine, micro, self.settings, gap)
            seen.append(metrics)
            return loss * next(scale)

        self.actor.train_step([trim_padding(mb.select(p)) for p in parts], loss_fn)
        # the micro-batches' metrics weighed as their losses are (the torch engine's combination)
        out = {k: sum(w * m[k] for w, m in zip(weights, seen, strict=True)) for k in seen[0]}
        norm = self.actor.engine.get_global_grad_norm()
        if norm is not None:
            out["actor/grad_norm"] = float(norm)
        return out

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        if is_lora(self.model):  # ZeRO 0-2 only (ZeRO-3 with LoRA is refused before Ray)
            if "weights" in self.actor.offloaded:
                raise WorkerError("DeepSpeed actor: weights are offloaded; reload_states() first")
            return merged_weights(self.model)
        if self.ds_settings.zero_stage == 3:
            # ZeRO-3 frees each gathered parameter after it is yielded: keep a copy.
            return [(n, t.detach().clone()) for n, t in self.actor.named_weights()]
        return list(self.actor.named_weights())

    def checkpoint_weights(self) -> dict[str, torch.Tensor] | None:
        if self.ds_settings.zero_stage != 3:
            return None
        # ZeRO-3 leaves each parameter an empty partition outside a gather: save_pretrained
        # would write empty tensors. Every rank joins; rank 0 gets the whole state dict.
        self._check_resident("save")
        return self.actor.engine._zero3_consolidated_16bit_state_dict() or {}

    def _shard_path(self, directory: str, rank: int) -> str:
        return os.path.join(directory, "optimizer", f"zero_rank{rank}.pt")

    def save_optimizer(self, directory: str, rank: int) -> None:
        if rank != 0 and not self.sharded_optimizer:
            return
        self._check_resident("save")
        os.makedirs(os.path.join(directory, "optimizer"), exist_ok=True)
        torch.save(self.actor.engine.optimizer.state_dict(), self._shard_path(directory, rank))
        if rank == 0:
            save_warmup(self.actor.engine.lr_scheduler, directory)

    def load_optimizer(self, directory: str, rank: int, world_size: int) -> None:
        self._check_resident("load")
        shards = sorted(glob.glob(os.path.join(directory, "optimizer", "zero_rank*.pt")))
        expected = world_size if self.sharded_optimizer else 1
        mine = self._shard_path(directory, rank if self.sharded_optimizer else 0)
        if len(shards) != expected or not os.path.isfile(mine):
            raise ConfigError(
                f"trainer.resume checkpoint {directory!r} holds {len(shards)} DeepSpeed optimizer "
                f"shard(s) but this run has {expected} (actor.zero_stage="
                f"{self.ds_settings.zero_stage}, {world_size} actor ranks): resume with the "
                f"placement it was written with; a checkpoint saved by rank 0 alone lacks the "
                f"other ranks' ZeRO shards (every actor rank must take part in save)"
            )
        state = torch.load(mine, map_location=self.device, weights_only=False)
        opt = self.actor.engine.optimizer
        if isinstance(opt, torch.optim.Optimizer):  # ZeRO-0 with torch's AdamW as is
            opt.load_state_dict(state)
        else:
            # DeepSpeed's optimizers read the shard at their data-parallel rank from a list, and
            # the fp32 master partition from the checkpoint too (no bf16 rounding).
            slots: list[Any] = [None] * max(world_size, rank + 1)
            slots[rank] = state
            opt.load_state_dict(slots, load_optimizer_states=True, load_from_fp32_weights=True)
        inner = getattr(opt, "optimizer", opt)
        resume_warmup(self.actor.engine.lr_scheduler, saved_warmup_steps(directory, inner))

    def _check_resident(self, what: str) -> None:
        if self.actor.offloaded:
            raise WorkerError(
                f"DeepSpeed actor: cannot {what} a checkpoint while {sorted(self.actor.offloaded)} "
                f"are offloaded; checkpoints run inside the actor's residency lease"
            )
