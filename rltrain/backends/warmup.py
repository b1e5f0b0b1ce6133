"""The learning-rate warmup both training engines use (linear, stepped per optimizer step) and
the step count it resumes from."""

from __future__ import annotations

import json
import os
from typing import Any

import torch

#: The checkpoint file holding the warmup's own step count (:func:`save_warmup`).
WARMUP_FILE = "warmup.json"


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The learning-rate multiplier of optimizer step ``step`` (0-based) under a linear warmup.

    Args:
        step: optimizer steps taken before this one.
        warmup_steps: ``optimizer.warmup_steps``; ``<= 0`` means no warmup.

    Returns:
        ``(step + 1) / warmup_steps`` during the warmup, 1 after it.
    """
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


def build_warmup(optimizer: Any, warmup_steps: int) -> Any:
    """A ``LambdaLR`` applying :func:`warmup_factor` (stepped after every optimizer step), or
    None without warmup. Building it sets the first step's learning rate at once."""
    if warmup_steps <= 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_factor(step, warmup_steps)
    )


def optimizer_steps(optimizer: Any) -> int:
    """Optimizer steps taken so far, read from the per-parameter ``step`` counters (AdamW's),
    so a resumed warmup continues where the checkpoint left it."""
    steps = [int(st["step"]) for st in getattr(optimizer, "state", {}).values() if "step" in st]
    return max(steps, default=0)


def save_warmup(scheduler: Any, directory: str) -> None:
    """Write the warmup's own step count into ``directory`` (nothing without a warmup).

    The count is the schedule's, not the optimizer's: under fp16 a step skipped for an overflow
    advances the warmup but no parameter's step counter, so only this count resumes the learning
    rate the uninterrupted run uses.

    Args:
        scheduler: the warmup (:func:`build_warmup`), or None.
        directory: the checkpoint directory (local).
    """
    if scheduler is None:
        return
    with open(os.path.join(directory, WARMUP_FILE), "w") as f:
        json.dump({"steps": int(scheduler.last_epoch)}, f)


def saved_warmup_steps(directory: str, optimizer: Any) -> int:
    """The step count a resumed warmup continues from.

    Args:
        directory: the checkpoint directory (local).
        optimizer: the torch optimizer the checkpoint's state was loaded into.

    Returns:
        The count :func:`save_warmup` wrote; for a checkpoint of a run without a warmup, the
        optimizer's steps (:func:`optimizer_steps`).
    """
    file = os.path.join(directory, WARMUP_FILE)
    if not os.path.isfile(file):
        return optimizer_steps(optimizer)
    with open(file) as f:
        return int(json.load(f)["steps"])


def resume_warmup(scheduler: Any, steps: int) -> None:
    """Put a warmup scheduler at ``steps`` optimizer steps (after loading a checkpoint)."""
    if scheduler is None:
        return
    scheduler.last_epoch = steps
    for group, base, fn in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
    ):
        group["lr"] = base * fn(steps)
