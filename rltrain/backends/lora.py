"""LoRA adapters on the actor's policy (``actor.lora.rank > 0``), with ``peft``.

The actor's policy is wrapped by :func:`wrap_lora`: every targeted ``Linear`` (a module whose
name ends with one of ``actor.lora.target_modules``) keeps its weight ``W`` frozen and gains two
trainable factors ``A`` (``r x in``) and ``B`` (``out x r``, zero at the start), so the layer
computes ``x @ (W + (alpha / r) * B @ A).T``. Only ``A`` and ``B`` are trainable and handed to
the optimizer. What follows from it:

- **Reference policy**: the base model is the policy with its adapters disabled, so with
  ``algorithm.kl_coef > 0`` and no ``reference`` component placed, the actor computes the
  reference log-probs itself (:func:`reference_logprobs`, peft's ``disable_adapter()``): no
  second copy of the weights.
- **Weight sync**: receivers (the rollout, the inference component) hold plain Hugging Face
  models, so the actor exports merged weights under their plain names
  (:func:`merged_weights`), computed beside the trained model, which is never merged in place.
- **Checkpoints** (:func:`save_checkpoint`, :func:`load_checkpoint`): ``model/`` holds the base
  weights in Hugging Face format (what the adapters apply to) and ``adapter/`` the adapter in
  peft's format (``adapter_config.json``, ``adapter_model.safetensors``), so
  ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("model"), "adapter")``
  loads the trained policy outside rltrain.

``peft`` is imported only when LoRA is on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, behaviour_logprobs
from rltrain.errors import ConfigError

#: The adapter's name inside the peft model (one adapter per policy).
ADAPTER = "default"
#: Checkpoint subdirectories: the base weights (HF format) and the adapter (peft format).
BASE_DIR, ADAPTER_DIR = "model", "adapter"
#: peft's file names inside ``adapter/``.
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def wrap_lora(model: torch.nn.Module, lora: Any) -> torch.nn.Module:
    """Wrap a Hugging Face causal LM with trainable LoRA adapters; the base weights freeze.

    Adapters take the model's dtype (peft's float32 up-cast is off), so the plan's sizes and
    the engines' dtype handling are those of the rest of the model.

    Args:
        model: the freshly built policy.
        lora: the ``actor.lora`` section (``rank`` > 0, ``alpha``, ``dropout``,
            ``target_modules``).

    Returns:
        The ``peft`` model (a ``PeftModelForCausalLM``); its ``parameters()`` that require
        grad are the adapters only.

    Raises:
        ConfigError: ``actor.lora.target_modules`` matches no ``Linear`` of the model.
    """
    import peft

    config = peft.LoraConfig(
        r=int(lora.rank),
        lora_alpha=float(lora.alpha),
        lora_dropout=float(lora.dropout),
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )
    try:
        with warnings.catch_warnings():  # peft asks transformers a deprecated question
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
            wrapped = peft.get_peft_model(model, config, autocast_adapter_dtype=False)
    except ValueError as exc:
        raise ConfigError(
            f"actor.lora.target_modules={list(lora.target_modules)} does not fit the model "
            f"({exc}): name Linear layers of the model (q_proj, k_proj, v_proj, o_proj, "
            f"gate_proj, up_proj, down_proj for Llama/Qwen2)"
        ) from None
    return wrapped


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft-wrapped policy (False without importing peft)."""
    if "peft" not in sys.modules:
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def plain_name(name: str) -> str:
    """The Hugging Face name of a base parameter of the wrapped model's base.

    ``model.layers.0.self_attn.q_proj.base_layer.weight`` -> ``model.layers.0.self_attn.
    q_proj.weight`` (peft moves a targeted layer's own weight under ``base_layer``).
    """
    return name.replace(".base_layer.", ".")


def _lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """The targeted layers by their module name in the base model."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.get_base_model().named_modules() if isinstance(m, LoraLayer)}


def delta_weight(layer: Any) -> torch.Tensor:
    """``(alpha / r) * B @ A`` of one targeted layer, in float32 (``out x in``, like ``W``)."""
    a = layer.lora_A[ADAPTER].weight.detach().float()
    b = layer.lora_B[ADAPTER].weight.detach().float()
    return layer.scaling[ADAPTER] * (b @ a)


@torch.no_grad()
def merged_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The policy as a plain model's weights: ``W + (alpha / r) * B @ A`` for targeted layers.

    New tensors are made for the merged layers (summed in float32, cast back to ``W``'s dtype);
    the trained model is not touched. The other parameters are passed as they are.

    Args:
        model: the peft-wrapped policy (:func:`wrap_lora`).

    Returns:
        ``(name, tensor)`` in the order and under the names of the unwrapped model's
        ``named_parameters()`` (tied weights once), as weight sync expects.
    """
    layers = _lora_layers(model)
    out = []
    for name, p in model.get_base_model().named_parameters():
        if ".lora_" in name:
            continue
        module, _, leaf = name.rpartition(".base_layer.")
        if leaf == "weight" and module in layers:
            merged = (p.detach().float() + delta_weight(layers[module])).to(p.dtype)
            out.append((plain_name(name), merged))
        else:
            out.append((plain_name(name), p.detach()))
    return out


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode for the duration (no adapter dropout), the previous mode restored after."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model for the duration: adapters off, eval mode (no adapter dropout)."""
    with eval_mode(model), model.disable_adapter():
        yield


@torch.no_grad()
def reference_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, s: UpdateSettings, micro_batch: int = 0
) -> torch.Tensor:
    """``[B, R]`` log-probs of the batch under the base model (the adapters disabled): the
    reference policy's, at the sampling temperature, ``micro_batch`` rows per forward pass."""
    with adapters_disabled(model):
        return behaviour_logprobs(model, batch, s, micro_batch)


# ------------------------------------------------------------------------------ checkpoints
def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base weights (adapters not merged) under the plain Hugging Face names."""
    return {
        plain_name(n): t
        for n, t in model.get_base_model().state_dict().items()
        if ".lora_" not in n
    }


def save_checkpoint(model: torch.nn.Module, directory: str) -> None:
    """Write the base model (``model/``, HF safetensors) and the adapter (``adapter/``, peft).

    Args:
        model: the peft-wrapped policy.
        directory: the checkpoint directory (the tokenizer goes into ``model/`` beside it).
    """
    base = model.get_base_model()
    base.save_pretrained(
        os.path.join(directory, BASE_DIR), state_dict=base_state(model), safe_serialization=True
    )
    model.save_pretrained(os.path.join(directory, ADAPTER_DIR), safe_serialization=True)


def load_checkpoint(model: torch.nn.Module, directory: str, path: str) -> None:
    """Restore base weights and adapter written by :func:`save_checkpoint`, in place.

    Args:
        model: the peft-wrapped policy, built with the run's ``actor.lora``.
        directory: the local checkpoint directory.
        path: the checkpoint as configured (for messages).

    Raises:
        ConfigError: the checkpoint holds no adapter (written with ``actor.lora.rank=0``) or
            one that does not fit ``actor.lora.*`` / ``model.*``.
    """
    import peft
    from safetensors.torch import load_file

    adapter = os.path.join(directory, ADAPTER_DIR, ADAPTER_WEIGHTS)
    if not os.path.isfile(adapter):
        raise ConfigError(
            f"trainer.resume checkpoint {path!r} holds no LoRA adapter ({ADAPTER_DIR}/"
            f"{ADAPTER_WEIGHTS}) but actor.lora.rank={model.peft_config[ADAPTER].r}: it was "
            f"written by full training; resume with actor.lora.rank=0, or start fresh "
            f"(trainer.resume=null)"
        )
    names = {plain_name(n): n for n in model.get_base_model().state_dict() if ".lora_" not in n}
    state = load_file(os.path.join(directory, BASE_DIR, "model.safetensors"))
    unknown = sorted(set(state) - set(names))
    missing = [n for n in names if n not in state and "lm_head" not in n]
    if unknown or missing:
        raise ConfigError(
            f"trainer.resume checkpoint {path!r} does not match model.* (missing {missing[:3]}, "
            f"unexpected {unknown[:3]}): resume with the model config it was written with, or "
            f"start fresh (trainer.resume=null)"
        )
    try:
        with torch.no_grad():  # DeepSpeed's parameters are views of its flat buffers
            model.get_base_model().load_state_dict(
                {names[k]: v for k, v in state.items()}, strict=False
            )
            result = peft.set_peft_model_state_dict(model, load_file(adapter), ADAPTER)
    except RuntimeError as exc:  # shape mismatch: another rank or target set
        raise ConfigError(
            f"trainer.resume checkpoint {path!r}: its adapter does not fit actor.lora.* ({exc}); "
            f"resume with the actor.lora settings it was written with"
        ) from None
    lacking = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or lacking:
        raise ConfigError(
            f"trainer.resume checkpoint {path!r}: its adapter does not fit actor.lora."
            f"target_modules (unexpected {result.unexpected_keys[:3]}, missing {lacking[:3]}): "
            f"resume with the actor.lora settings it was written with"
        )
