"""Mixed precision for the torch training engines: 16-bit compute, fp32 master weights and state.

A model trained in ``bfloat16`` or ``float16`` (``model.dtype``) keeps its parameters in that
dtype: the forward and backward passes, the gradients (accumulated over micro-batches and
all-reduced by DDP) and the weights every other component receives are 16-bit. What the
optimizer steps is an fp32 *master* copy of every trained 16-bit parameter, with fp32 AdamW
moments; after each step the masters are rounded into the model. Stepping the 16-bit weights
themselves would round most updates away: an update of ``lr = 1e-5`` moves a bf16 weight of
magnitude ``4e-3`` or more by less than half a unit in its last place (bf16 keeps 8 significant
bits), so it is lost, while the master accumulates it until the rounded weight moves.

:class:`MasterWeightOptimizer` wraps the torch optimizer built over the masters and offers what
the update loop (:func:`~rltrain.algorithms.update.accumulate_step`) and the state mover use of
an optimizer:

- ``scale_loss(loss)``: the loss times the fp16 loss scale (unchanged in bf16);
- ``clip_and_step(grad_clip)``: the global gradient norm in fp32 (loss scale taken out), the
  clip, then the step in chunks: the fp32 gradients of one chunk of parameters (at most
  :data:`CHUNK_BYTES`, or one parameter larger than that) exist at a time, so the step adds at
  most that much to the state the plan counts;
- ``state`` / ``state_dict`` / ``load_state_dict``: the masters belong to the optimizer state
  (the plan's ``optimizer`` term is ``8 + 4`` bytes per trained parameter: two moments and the
  master), are moved by the offload policy with it, and are written into checkpoints, so a
  resumed run continues from the fp32 values, not the rounded ones.

fp16 adds dynamic loss scaling (:class:`LossScale`, torch.amp's ``GradScaler`` rules): the loss
is multiplied by the scale before the backward pass so small gradients survive fp16; a step
whose gradients overflowed is skipped and the scale halved; after ``growth_interval`` good
steps in a row the scale doubles. bf16 has fp32's exponent range and needs no scaling.

Parameters already in fp32 (the critic's value head beside a bf16 trunk) are their own master.
Frozen parameters (a LoRA base) get none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from rltrain.errors import ConfigError

#: fp32 gradient bytes one chunk of the optimizer step holds at most (unless one parameter is
#: larger): the step's only memory beyond the weights, gradients and optimizer state.
CHUNK_BYTES = 256 * 1024**2
#: The format tag of :meth:`MasterWeightOptimizer.state_dict`.
STATE_FORMAT = "rltrain.master_weights.v1"


@dataclass
class LossScale:
    """Dynamic loss scaling for fp16 training (the rules of ``torch.amp.GradScaler``).

    Attributes:
        scale: the factor the loss is multiplied by before the backward pass.
        growth_factor: the scale's factor after ``growth_interval`` finite steps in a row.
        backoff_factor: the scale's factor after a step whose gradients overflowed.
        growth_interval: finite steps in a row before the scale grows.
        good_steps: finite steps since the last overflow or growth.
        skipped: optimizer steps skipped for overflowing gradients, whole run.
    """

    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    good_steps: int = 0
    skipped: int = 0

    def update(self, finite: bool) -> None:
        """Record one step: back off after an overflow, grow after enough finite steps."""
        if not finite:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0


def global_grad_norm(grads: Sequence[Tensor]) -> float:
    """The L2 norm of all gradients together, accumulated in fp32 (``inf``/``nan`` when one is)."""
    if not grads:
        return 0.0
    norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads])
    return float(torch.linalg.vector_norm(norms))


def _fp32(value: Tensor | None, param: Tensor) -> Tensor:
    """A master: the given fp32 value (used as is), else a fp32 copy of ``param``."""
    if value is not None and value.dtype == torch.float32 and value.shape == param.shape:
        return value.detach()
    return param.detach().float().clone()


def _chunks(params: Sequence[Tensor], limit: int) -> list[list[int]]:
    """Consecutive parameter indices grouped under ``limit`` fp32 bytes (a larger one alone)."""
    out: list[list[int]] = [[]]
    size = 0
    for i, p in enumerate(params):
        nbytes = p.numel() * 4
        if out[-1] and size + nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(i)
        size += nbytes
    return [c for c in out if c]


class MasterWeightOptimizer:
    """An optimizer over fp32 masters of a model's 16-bit trained parameters (module docstring).

    Args:
        params: the model's trained parameters (16-bit, or fp32 ones that are their own master).
        build: makes the torch optimizer over the given fp32 tensors (AdamW with the
            ``optimizer.*`` settings).
        loss_scale: dynamic loss scaling (fp16); None for bf16.
        chunk_bytes: fp32 gradient bytes the step holds at once (:data:`CHUNK_BYTES`).
        initial: fp32 starting values of the masters, by parameter (the weights before they
            were cast to 16-bit); a 16-bit parameter missing here starts from its own value.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        build: Callable[[list[Tensor]], torch.optim.Optimizer],
        loss_scale: LossScale | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        initial: dict[torch.nn.Parameter, Tensor] | None = None,
    ) -> None:
        self.params = list(params)
        start = initial or {}
        with torch.no_grad():
            self.masters = [
                p if p.dtype == torch.float32 else _fp32(start.get(p), p) for p in self.params
            ]
        self.optimizer = build(self.masters)
        self.loss_scale = loss_scale
        self._chunks = _chunks(self.masters, chunk_bytes)

    # ------------------------------------------------------------ what an optimizer offers
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's groups (learning-rate schedules act on them)."""
        return self.optimizer.param_groups

    @property
    def state(self) -> dict[Tensor, dict[str, Any]]:
        """Per master, the inner optimizer's state plus the master itself (``master``) where it
        is a copy: what the state mover moves and the ledger counts as ``optimizer``."""
        out: dict[Tensor, dict[str, Any]] = {}
        for p, m in zip(self.params, self.masters, strict=True):
            entry = dict(self.optimizer.state.get(m, {}))
            if m is not p:
                entry["master"] = m
            out[m] = entry
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) the model's gradients."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def scale_loss(self, loss: Tensor) -> Tensor:
        """The loss the backward pass takes: times the fp16 loss scale (as is in bf16)."""
        return loss if self.loss_scale is None else loss * self.loss_scale.scale

    def step(self) -> None:
        """One optimizer step without clipping."""
        self.clip_and_step(0.0)

    def clip_and_step(self, grad_clip: float) -> float:
        """Clip the global gradient norm to ``grad_clip`` and step the masters.

        Args:
            grad_clip: the max global norm (``optimizer.grad_clip``); ``<= 0`` does not clip.

        Returns:
            The global norm before clipping, loss scale taken out (``inf``/``nan`` for an
            overflowed fp16 step, which is then skipped).
        """
        grads = [p.grad for p in self.params if p.grad is not None]
        inv = 1.0 if self.loss_scale is None else 1.0 / self.loss_scale.scale
        norm = global_grad_norm(grads) * inv
        if self.loss_scale is not None:
            finite = math.isfinite(norm)
            self.loss_scale.update(finite)
            if not finite:  # overflowed: no step, the next one runs with a smaller scale
                # zeroed in place, not dropped: under data parallelism the gradients are views
                # of DDP's buckets, which an offload can reach only through them
                self.zero_grad(set_to_none=False)
                return norm
        coef = min(grad_clip / (norm + 1e-6), 1.0) if grad_clip > 0 else 1.0
        self._step_chunks(inv * coef)
        return norm

    @torch.no_grad()
    def _step_chunks(self, factor: float) -> None:
        """Step the masters one chunk at a time and round them into the model.

        The inner optimizer skips parameters without a gradient, so giving gradients to one
        chunk's masters at a time steps exactly that chunk: each gradient is taken away again
        after its chunk's step (a later chunk's step would step it twice), and the fp32
        parameters get theirs back at the end, as fp32 training leaves them.
        """
        own = {}  # fp32 parameters' own gradients, held back until their chunk
        for i, (p, m) in enumerate(zip(self.params, self.masters, strict=True)):
            if m is p and p.grad is not None:
                own[i], p.grad = p.grad, None
        for chunk in self._chunks:
            stepped = []
            for i in chunk:
                p, m = self.params[i], self.masters[i]
                if m is p:
                    if i in own:
                        m.grad = own[i].mul_(factor)
                        stepped.append(i)
                elif p.grad is not None:
                    m.grad = p.grad.float().mul_(factor)
                    stepped.append(i)
            if not stepped:
                continue
            self.optimizer.step()
            for i in stepped:
                p, m = self.params[i], self.masters[i]
                m.grad = None
                if m is not p:  # the model keeps its 16-bit gradient, as fp32 training does
                    p.copy_(m)
        for i, grad in own.items():
            self.params[i].grad = grad

    @torch.no_grad()
    def sync_params(self) -> None:
        """Round the masters into the model's parameters."""
        for p, m in zip(self.params, self.masters, strict=True):
            if m is not p:
                p.copy_(m)

    # ---------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state, the fp32 masters of the 16-bit parameters (in parameter
        order) and the loss scale."""
        return {
            "format": STATE_FORMAT,
            "optimizer": self.optimizer.state_dict(),
            "masters": [m for p, m in zip(self.params, self.masters, strict=True) if m is not p],
            "loss_scale": None if self.loss_scale is None else asdict(self.loss_scale),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`, then round the masters into the model.

        A plain torch optimizer's state dict (a checkpoint written before masters existed, or
        one of a float32 run) loads too: its moments become fp32 and the masters are taken
        from the model's current parameters.

        Raises:
            ConfigError: the checkpoint holds masters of other parameters.
        """
        if state.get("format") != STATE_FORMAT:
            self.optimizer.load_state_dict(state)
            with torch.no_grad():
                for p, m in zip(self.params, self.masters, strict=True):
                    if m is not p:
                        m.copy_(p)
            return
        copies = [m for p, m in zip(self.params, self.masters, strict=True) if m is not p]
        saved = state["masters"]
        shapes = [tuple(t.shape) for t in saved]
        if shapes != [tuple(m.shape) for m in copies]:
            raise ConfigError(
                f"trainer.resume checkpoint: its optimizer holds {len(saved)} fp32 master "
                f"weights of other shapes than this model's {len(copies)} 16-bit trained "
                f"parameters: resume with the model.* and actor.lora.* it was written with"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for m, t in zip(copies, saved, strict=True):
                m.copy_(t)
        if self.loss_scale is not None and state.get("loss_scale"):
            self.loss_scale = LossScale(**state["loss_scale"])
        self.sync_params()


def needs_masters(model: torch.nn.Module) -> bool:
    """Whether any trained parameter of ``model`` is 16-bit (then it trains through masters)."""
    return any(p.requires_grad and p.dtype != torch.float32 for p in model.parameters())


def needs_loss_scale(model: torch.nn.Module) -> bool:
    """Whether any trained parameter is float16 (bf16 needs no loss scaling)."""
    return any(p.requires_grad and p.dtype == torch.float16 for p in model.parameters())
