"""Tokenizers: rltrain's built-in character-level tokenizer, or any local Hugging Face one.

The built-in tokenizer is a real ``PreTrainedTokenizerFast`` (a ``tokenizers`` word-level model
over single characters), so it saves and loads in Hugging Face format and the rest of the code
treats it exactly like a checkpoint's tokenizer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rltrain.config.schema import SPECIAL_TOKENS
from rltrain.errors import ConfigError

#: Characters of the built-in tokenizer when ``model.vocab_chars`` is null: enough for arithmetic.
#: A small alphabet matters for RL from a random initialisation: a random policy must sometimes
#: emit the right answer by chance for the reward to carry any signal.
DEFAULT_CHARS = "0123456789+-*/=(). "


def build_char_tokenizer(chars: str = DEFAULT_CHARS) -> Any:
    """Build the character-level tokenizer.

    Ids are ``<pad>``=0, ``<eos>``=1, ``<unk>``=2, then ``chars`` in order. Padding is on the left
    (generation appends to the right end of every row). Unknown characters map to ``<unk>``.

    Args:
        chars: the alphabet; each character becomes one token.

    Returns:
        A ``transformers.PreTrainedTokenizerFast``.

    Raises:
        ConfigError: ``chars`` is empty or repeats a character.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not chars or len(set(chars)) != len(chars):
        raise ConfigError(
            f"model.vocab_chars={chars!r} must be a non-empty string without repeated characters"
        )
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for c in chars:
        vocab[c] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # "[\s\S]", not ".": a line break is a character like any other ("." skips it, and a run of
    # them then reaches the word-level model as one unknown word)
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join back without separators
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def load_tokenizer(path: str, key: str = "model.tokenizer_path") -> Any:
    """Load a Hugging Face tokenizer from a local directory, set up for batched generation.

    Args:
        path: the directory holding ``tokenizer.json`` / ``tokenizer_config.json``.
        key: the config key the path came from, for error messages.

    Returns:
        The tokenizer, padding on the left, with a pad token (its EOS when it had none).

    Raises:
        ConfigError: the directory is missing or holds no loadable tokenizer.
    """
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise ConfigError(f"{key}={path!r} does not exist or is not a directory")
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(
            f"{key}={path!r} holds no loadable Hugging Face tokenizer ({exc}); set "
            f"model.tokenizer_path to a directory saved with tokenizer.save_pretrained()"
        ) from None
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ConfigError(f"{key}={path!r}: the tokenizer has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token  # batched generation needs a pad id; EOS is masked anyway
    return tok


def tokenizer_source(model_cfg: Any) -> str:
    """Where :func:`build_tokenizer` takes the tokenizer from, as messages name it."""
    if model_cfg.tokenizer_path:
        return f"model.tokenizer_path={model_cfg.tokenizer_path!r}"
    if model_cfg.path:
        return f"model.path={model_cfg.path!r}"
    return "the built-in character tokenizer, model.vocab_chars"


def build_tokenizer(model_cfg: Any) -> Any:
    """The tokenizer of a model config.

    ``model.tokenizer_path`` wins; else ``model.path`` (the checkpoint's own tokenizer); else the
    built-in character tokenizer over ``model.vocab_chars``.

    Args:
        model_cfg: a :class:`rltrain.config.schema.ModelConfig` (or any object with its fields).

    Returns:
        A Hugging Face tokenizer that pads on the left.

    Raises:
        ConfigError: a path does not hold a tokenizer, or ``model.vocab_chars`` is empty or
            repeats a character.
    """
    if model_cfg.tokenizer_path:
        return load_tokenizer(model_cfg.tokenizer_path, "model.tokenizer_path")
    if model_cfg.path:
        return load_tokenizer(model_cfg.path, "model.path")
    chars = getattr(model_cfg, "vocab_chars", None)
    return build_char_tokenizer(DEFAULT_CHARS if chars is None else chars)


def prompt_token_ids(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Each prompt's token ids exactly as :func:`encode_prompts` feeds them, unpadded.

    The tokenizer's special tokens (a BOS) are added, except to a prompt that already starts
    with the BOS text: a chat template that writes ``<|begin_of_text|>`` itself would otherwise
    get a second one. The choice is per prompt, so a prompt encodes the same in any batch.

    Args:
        tokenizer: a Hugging Face tokenizer.
        prompts: the prompt texts.

    Returns:
        One id list per prompt (its length is the prompt's length in tokens).
    """
    prompts = list(prompts)
    bos = getattr(tokenizer, "bos_token", None)
    has_bos = [bool(bos) and p.startswith(bos) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    for flag in (False, True):
        idx = [i for i, h in enumerate(has_bos) if h == flag]
        if idx:
            enc = _encode_batch(tokenizer, [prompts[i] for i in idx], add_special_tokens=not flag)
            for i, ids in zip(idx, enc, strict=True):
                out[i] = list(ids)
    return out


def _encode_batch(tokenizer: Any, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    """``tokenizer(texts, add_special_tokens=...)["input_ids"]``, straight through a fast
    tokenizer's Rust backend when it pads and truncates nothing (then the ids are the same,
    without the per-row conversion that dominates on 100k-row datasets)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.padding is None and backend.truncation is None:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
    return tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
