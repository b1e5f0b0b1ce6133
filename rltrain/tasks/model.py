"""The policy model: a tiny causal LM built from config fields, or a local HF checkpoint.

Both paths return a ``transformers.PreTrainedModel``; a built model saved with
``save_pretrained`` loads back through ``model.path`` with the same code.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from rltrain.errors import ConfigError
from rltrain.tasks.tokenizer import build_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map ``model.dtype`` to a torch dtype.

    Raises:
        ConfigError: an unknown dtype name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r} is not valid: choose one of {list(DTYPES)}")
    return DTYPES[dtype]


def tiny_model_config(model_cfg: Any, tokenizer: Any) -> Any:
    """A transformers config for the built-in model, sized by ``model_cfg`` and the tokenizer.

    Args:
        model_cfg: a :class:`rltrain.config.schema.ModelConfig`.
        tokenizer: the model's tokenizer (vocabulary size and special ids).

    Returns:
        A ``LlamaConfig`` or ``Qwen2Config``.

    Raises:
        ConfigError: an unknown ``model.family``, or ``model.vocab_size`` below the tokenizer's
            size.
    """
    from transformers import LlamaConfig, Qwen2Config

    families = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if model_cfg.family not in families:
        raise ConfigError(
            f"model.family={model_cfg.family!r} is not valid: choose one of {list(families)}"
        )
    vocab = len(tokenizer)
    if model_cfg.vocab_size is not None:
        if model_cfg.vocab_size < vocab:
            raise ConfigError(
                f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's {vocab} "
                f"tokens: give at least {vocab}, or null for the tokenizer's size"
            )
        vocab = model_cfg.vocab_size  # padded rows, as real checkpoints have
    return families[model_cfg.family](
        vocab_size=vocab,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_kv_heads,
        max_position_embeddings=model_cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=model_cfg.tie_word_embeddings,
    )


def check_checkpoint_dir(path: str, key: str = "model.path") -> None:
    """Refuse a path that is not a local Hugging Face checkpoint directory.

    Raises:
        ConfigError: the directory is missing or has no ``config.json``.
    """
    if not os.path.isdir(path):
        raise ConfigError(
            f"{key}={path!r} does not exist or is not a directory: give a local Hugging Face "
            f"checkpoint directory, or {key}=null to build the tiny model"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(
            f"{key}={path!r} has no config.json, so it is not a Hugging Face checkpoint: point "
            f"it at the directory that holds config.json"
        )


def build_model(model_cfg: Any, dtype: str | torch.dtype | None = None) -> Any:
    """Build or load the policy model on CPU.

    With ``model.path`` the checkpoint is loaded with ``from_pretrained`` from local files only.
    Otherwise a Llama/Qwen2 model is built from the config fields and initialised from
    ``model.init_seed`` without touching the caller's global RNG state.

    Args:
        model_cfg: a :class:`rltrain.config.schema.ModelConfig`.
        dtype: parameter dtype; None uses ``model.dtype``.

    Returns:
        A ``transformers.PreTrainedModel`` in eval mode.

    Raises:
        ConfigError: the path is not a loadable checkpoint, or a field is invalid.
    """
    from transformers import AutoModelForCausalLM

    torch_dtype = resolve_dtype(dtype if dtype is not None else model_cfg.dtype)
    if model_cfg.path:
        check_checkpoint_dir(model_cfg.path)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                model_cfg.path, local_files_only=True, dtype=torch_dtype
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"model.path={model_cfg.path!r} is not a loadable causal-LM checkpoint ({exc}); "
                f"save one with model.save_pretrained(dir)"
            ) from None
        return model.eval()
    config = tiny_model_config(model_cfg, build_tokenizer(model_cfg))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(model_cfg.init_seed)
        model = AutoModelForCausalLM.from_config(config)
    return model.to(torch_dtype).eval()
