"""Checks of the files and directories a config names, made before anything starts.

Hugging Face checkpoints (``model.path``, ``reward.model_path``): ``config.json`` parses, the
architecture fits the role, the weights are there, the dtype a checkpoint was saved in
(``model.dtype: null`` follows it), and the model-building fields set beside ``model.path``
describe it (:func:`built_field_problems`). Output directories (``trainer.checkpoint_dir``,
``placement.auto.cache_dir``): writable, or their fsspec filesystem installed. No Ray, no torch.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

#: ``model.dtype`` values, and the checkpoint ``torch_dtype`` spellings that map to them.
DTYPES = ("float32", "bfloat16", "float16")
_CHECKPOINT_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
_CHECKPOINT_DTYPES.update({"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"})
_CHECKPOINT_DTYPES.update({"torch.float32": "float32", "torch.bfloat16": "bfloat16"})
_CHECKPOINT_DTYPES["torch.float16"] = "float16"


def checkpoint_config(path: str | None) -> dict[str, Any] | None:
    """A Hugging Face checkpoint's ``config.json`` as a dict; None when missing or unreadable
    (the checks below say which)."""
    if not path:
        return None
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def model_dtype(path: str | None, dtype: str | None) -> str:
    """``model.dtype`` as the run uses it.

    Args:
        path: ``model.path`` (None for a model built from the fields, or one the task's
            generator has yet to write).
        dtype: the configured ``model.dtype``; None follows the checkpoint.

    Returns:
        ``dtype`` when set; else the checkpoint's ``torch_dtype`` (or ``dtype``, as newer
        transformers write it) when it is float32, bfloat16 or float16; else ``float32``.
    """
    if dtype is not None:
        return dtype
    config = checkpoint_config(path) or {}
    stored = config.get("torch_dtype") or config.get("dtype")
    return _CHECKPOINT_DTYPES.get(str(stored), "float32")


#: Architecture name endings of a policy (a causal language model with its LM head).
POLICY_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
#: ... and of a reward model (one score per text).
REWARD_HEADS = ("ForSequenceClassification",)

#: Weight files a Hugging Face checkpoint may hold (sharded ones through their index).
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def checkpoint_problems(key: str, path: str, heads: tuple[str, ...]) -> Iterator[str]:
    """A checkpoint directory that holds ``config.json``: the file must parse and name an
    architecture with one of ``heads`` (when it names any). The weights are checked before
    training (:func:`weights_problems`).

    Args:
        key: the config key that named the directory (``model.path``, ``reward.model_path``).
        path: the directory.
        heads: the architecture name endings this key accepts (:data:`POLICY_HEADS`,
            :data:`REWARD_HEADS`).
    """
    config_path = os.path.join(path, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as exc:
        yield (
            f"{key}={path!r}: config.json is not valid JSON ({exc}): restore the checkpoint's "
            f"config.json (save_pretrained writes it)"
        )
        return
    except OSError as exc:
        yield f"{key}={path!r}: config.json cannot be read ({exc.strerror or exc}): fix it"
        return
    if not isinstance(config, dict):
        yield f"{key}={path!r}: config.json holds no object: restore the checkpoint's config.json"
        return
    names = [str(a) for a in config.get("architectures") or []]
    if names and not any(a.endswith(heads) for a in names):
        yield _wrong_head(key, path, names, heads)


#: The ``model`` fields that build a model from the config, by the ``config.json`` key holding the
#: same value in a Hugging Face checkpoint (``family`` is its ``model_type``). A checkpoint is
#: loaded as saved, so with ``model.path`` these fields can only describe it.
BUILD_FIELDS = {
    "family": "model_type",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "max_position_embeddings": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "tie_word_embeddings": "tie_word_embeddings",
}


def built_field_problems(path: str, fields: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """Model-building fields set beside a checkpoint that disagree with its ``config.json``.

    A field at its schema default counts as unset (the default ``model`` option sets every
    field); one equal to the checkpoint's value describes it (``model=qwen2_0_5b`` beside a
    Qwen2-0.5B checkpoint). ``max_position_embeddings`` may also be below the checkpoint's: a
    preset that sizes the model it generates (``experiment=gsm8k_tiny``: 256) names a context
    any larger checkpoint given in its place covers. ``dtype`` is not here: it is the compute
    dtype, read with a checkpoint too.

    Args:
        path: ``model.path``, a directory holding ``config.json``.
        fields: the ``model`` section's values by field name (extra names are ignored).
        defaults: the schema's default of each field (``vars(ModelConfig())``).

    Returns:
        One message per disagreeing field, naming the key, both values and the fix; empty when
        none disagrees or ``config.json`` cannot be read (:func:`checkpoint_problems` says why).
    """
    config = checkpoint_config(path)
    if config is None:
        return []
    problems = []
    for name, json_key in BUILD_FIELDS.items():
        value, stored = fields.get(name), _stored(config, json_key)
        if value == defaults.get(name) or stored is None or value == stored:
            continue
        if name == "max_position_embeddings" and isinstance(stored, int) and value < stored:
            continue
        problems.append(
            f"model.{name}={value!r} disagrees with model.path={path!r}, whose config.json has "
            f"{json_key}={stored!r}: a checkpoint is loaded as saved, so the field would be "
            f"ignored. Set model.{name}={stored!r} (or drop it if you set it), or point "
            f"model.path at the checkpoint it describes"
        )
    return problems


def _stored(config: dict[str, Any], key: str) -> Any:
    """A checkpoint's value of ``key`` (None when it has none; Hugging Face reads a missing
    ``num_key_value_heads`` as ``num_attention_heads``)."""
    if key == "num_key_value_heads" and config.get(key) is None:
        key = "num_attention_heads"
    return config.get(key)


def weights_problems(key: str, path: str) -> list[str]:
    """A checkpoint directory without its weights (training needs them; a plan does not, so
    ``mode=plan`` may plan a model from its config.json alone).

    Args:
        key: the config key that named the directory.
        path: the directory (holding config.json).

    Returns:
        The problem, naming the key, the value and the fix; empty when the weights are there.
    """
    missing = _missing_weights(path)
    if not missing:
        return []
    return [
        f"{key}={path!r} {missing}: training loads the weights beside config.json "
        f"(model.save_pretrained(dir) writes model.safetensors); point {key} at a complete "
        f"checkpoint (mode=plan plans from config.json alone)"
    ]


def _wrong_head(key: str, path: str, names: list[str], heads: tuple[str, ...]) -> str:
    if heads == REWARD_HEADS:
        return (
            f"{key}={path!r} holds {names}, not a sequence-classification model: a reward "
            f"model gives one score per text (AutoModelForSequenceClassification, e.g. "
            f"...ForSequenceClassification with num_labels=1); a causal language model would "
            f"get an untrained score head. Point {key} at a reward model, or use "
            f"reward.kind=rule"
        )
    return (
        f"{key}={path!r} holds {names}, not a causal language model (...ForCausalLM): the "
        f"policy generates text with its LM head. Point {key} at a causal LM checkpoint"
        + (
            "; a ...ForSequenceClassification checkpoint is a reward model "
            "(reward.kind=model reward.model_path=...)"
            if any(n.endswith(REWARD_HEADS) for n in names)
            else ""
        )
    )


def _missing_weights(path: str) -> str:
    """Why a checkpoint directory lacks weights ("" when they are there)."""
    try:
        files = set(os.listdir(path))
    except OSError as exc:
        return f"cannot be listed ({exc.strerror or exc})"
    for index in _WEIGHT_INDEXES:
        if index in files:
            try:
                with open(os.path.join(path, index), encoding="utf-8") as f:
                    shards = set((json.load(f).get("weight_map") or {}).values())
            except (OSError, ValueError, AttributeError) as exc:
                return f"has an unreadable {index} ({exc})"
            absent = sorted(shards - files)
            if absent:
                return f"lacks {absent[:3]} listed in {index}"
            return ""
    if any(f.endswith(_WEIGHT_SUFFIXES) for f in files):
        return ""
    return "holds no weights (no *.safetensors or pytorch_model.bin)"


def filesystem_missing(key: str, url: str, exc: ImportError) -> str:
    """A checkpoint URI whose fsspec filesystem is not installed: the message and the fix."""
    protocol = url.split("://", 1)[0]
    package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}.get(
        protocol, f"the fsspec filesystem for {protocol}://"
    )
    return (
        f"{key}={url!r}: fsspec cannot open {protocol}:// storage here ({exc}): pip install "
        f"{package}, or use a local or NFS path"
    )


def checkpoint_dir_problems(
    url: str | None, probe: bool = True, key: str = "trainer.checkpoint_dir"
) -> list[str]:
    """Problems of the checkpoint directory a run will write, found before anything starts.

    A URI needs its fsspec filesystem package. A local directory must be creatable and
    writable: with ``probe``, a file is written into it and removed (with any directory made
    for it, so a refused run leaves nothing); without, only permissions are read (``mode=plan``
    writes nothing).

    Args:
        url: ``trainer.checkpoint_dir`` (None: the run directory's own).
        probe: write a probe file (training); False reads permissions only.
        key: the config key, for messages.

    Returns:
        Problem messages naming the key, the value and the fix; empty when fine.
    """
    if not url:
        return []
    if "://" in url and not url.startswith("file://"):
        try:
            import fsspec

            fsspec.core.url_to_fs(url)
        except ImportError as exc:
            return [filesystem_missing(key, url, exc)]
        except (ValueError, OSError) as exc:
            return [f"{key}={url!r} cannot be opened ({exc}): give a local path or a valid URI"]
        return []
    path = os.path.abspath(url[len("file://") :] if url.startswith("file://") else url)
    fix = f"point {key} at a writable directory (or fix its permissions)"
    if os.path.exists(path) and not os.path.isdir(path):
        return [f"{key}={url!r} is a file, not a directory: point it at a directory"]
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not probe:
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            return [f"{key}={url!r} cannot be written ({existing!r} is not writable): {fix}"]
        return []
    try:
        os.makedirs(path, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".rltrain-probe-", dir=path)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return [f"{key}={url!r} cannot be written ({exc.strerror or exc}): {fix}"]
    finally:
        made = path
        while made != existing and os.path.isdir(made):
            try:
                os.rmdir(made)  # only what this check made, only while empty
            except OSError:
                break
            made = os.path.dirname(made)
    return []


#: What a run writes into its checkpoint directory (:mod:`rltrain.runners.checkpoint`): the
#: ``latest`` pointer, ``step-NNNNNN/`` directories holding its trainer state or manifest, and
#: temporary writes it publishes or removes.
CHECKPOINT_STEP = re.compile(r"step-\d{6}")
_CHECKPOINT_MARKS = ("trainer_state.json", "manifest.json")
_CHECKPOINT_TEMPS = (".tmp-step-", ".latest-", ".rltrain-probe-")


def is_rltrain_checkpoint(path: str) -> bool:
    """Whether ``path`` (local) is a ``step-NNNNNN`` directory a run wrote: its state or
    manifest proves it."""
    return CHECKPOINT_STEP.fullmatch(os.path.basename(path)) is not None and any(
        os.path.isfile(os.path.join(path, mark)) for mark in _CHECKPOINT_MARKS
    )


def checkpoint_dir_contents(path: str) -> tuple[list[str], list[str]]:
    """A local checkpoint directory's entries: (what rltrain did not write, its checkpoints).

    Args:
        path: an existing local directory.

    Returns:
        The names of entries a run would not have written there, and of the published
        ``step-NNNNNN`` checkpoints, both sorted.
    """
    foreign, checkpoints = [], []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if is_rltrain_checkpoint(full):
            checkpoints.append(name)
        elif name.startswith(_CHECKPOINT_TEMPS):
            continue
        elif name == "latest" and os.path.isfile(full) and _points_at_step(full):
            continue
        else:
            foreign.append(name + ("/" if os.path.isdir(full) else ""))
    return foreign, checkpoints


def _points_at_step(pointer: str) -> bool:
    try:
        with open(pointer, encoding="utf-8") as f:
            return CHECKPOINT_STEP.fullmatch(f.read(64).strip()) is not None
    except (OSError, UnicodeDecodeError):
        return False


def inputs_in_checkpoint_dir(url: str | None, inputs: dict[str, str | None]) -> list[str]:
    """Refuse inputs read from a checkpoint the run may prune (``keep`` newest are kept).

    Args:
        url: ``trainer.checkpoint_dir``.
        inputs: config key -> the local path it reads (``model.path``, ``task.path``, ...).

    Returns:
        Problem messages naming the key, the value and the fix; empty when fine.
    """
    if not url or ("://" in url and not url.startswith("file://")):
        return []
    root = os.path.realpath(url[len("file://") :] if url.startswith("file://") else url)
    problems = []
    for key, value in inputs.items():
        if not value or "://" in value:
            continue
        rel = os.path.relpath(os.path.realpath(value), root)
        first = rel.split(os.sep)[0]
        if rel != os.curdir and not rel.startswith(os.pardir) and CHECKPOINT_STEP.fullmatch(first):
            problems.append(
                f"{key}={value!r} lies in trainer.checkpoint_dir={url!r}, whose older checkpoints "
                f"the run deletes as it saves newer ones: copy {first} out of it and point {key} "
                f"at the copy, or give the run another trainer.checkpoint_dir"
            )
    return problems


def checkpoint_dir_owner_problems(url: str | None, resume: str | None) -> list[str]:
    """Refuse a checkpoint directory whose files a run would replace or delete.

    A run writes ``step-NNNNNN/`` and ``latest`` there, replaces a checkpoint of the same step
    and deletes older ones: a local directory holding anything else (the user's files, a model,
    a source tree) is refused, and so is one holding earlier checkpoints when the run does not
    continue them (``trainer.resume=null``). URIs are not listed here; the writer itself touches
    only checkpoints it wrote.

    Args:
        url: ``trainer.checkpoint_dir`` (None: the run directory's own).
        resume: ``trainer.resume``.

    Returns:
        Problem messages naming the key, the value and the fix; empty when fine.
    """
    if not url or ("://" in url and not url.startswith("file://")):
        return []
    path = os.path.abspath(url[len("file://") :] if url.startswith("file://") else url)
    if not os.path.isdir(path):
        return []
    try:
        foreign, checkpoints = checkpoint_dir_contents(path)
    except OSError:
        return []  # unreadable: the writability check names it
    key = f"trainer.checkpoint_dir={url!r}"
    if foreign:
        shown = ", ".join(foreign[:4]) + (
            f" and {len(foreign) - 4} more" if len(foreign) > 4 else ""
        )
        return [
            f"{key} holds files rltrain did not write ({shown}): a run writes step-NNNNNN/ and "
            f"latest there, replacing and deleting older checkpoints, so it needs a directory of "
            f"its own: point trainer.checkpoint_dir at a new or empty directory (e.g. "
            f"{path.rstrip(os.sep) + '-checkpoints'!r})"
        ]
    if checkpoints and resume is None:
        shown = ", ".join(checkpoints[-3:])
        return [
            f"{key} holds checkpoints of an earlier run ({shown}) and trainer.resume=null starts "
            f"afresh, which would replace and delete them: set trainer.resume=auto to continue "
            f"them, or point trainer.checkpoint_dir at a new directory"
        ]
    return []
