"""Built-in tasks, the tokenizer and the tiny model (no download needed).

``build_task(task_cfg, tokenizer)`` gives a :class:`Task`: training and evaluation prompts, a
deterministic ``sample_batch(step, batch_size)`` and ``reward(prompt, response)``.
``build_tokenizer(model_cfg)`` and ``build_model(model_cfg, dtype)`` give Hugging Face objects,
built from config fields or loaded from ``model.path``.
"""

from __future__ import annotations

from typing import Any

from rltrain.errors import ConfigError
from rltrain.tasks.arithmetic import arithmetic_examples, build_arithmetic_task
from rltrain.tasks.base import Example, RewardFn, Task, exact_match, import_reward_fn
from rltrain.tasks.file_task import build_file_task, read_examples
from rltrain.tasks.model import build_model, resolve_dtype
from rltrain.tasks.tokenizer import DEFAULT_CHARS, build_char_tokenizer, build_tokenizer

__all__ = [
    "DEFAULT_CHARS",
    "Example",
    "RewardFn",
    "Task",
    "arithmetic_examples",
    "build_arithmetic_task",
    "build_char_tokenizer",
    "build_file_task",
    "build_model",
    "build_task",
    "build_tokenizer",
    "exact_match",
    "import_reward_fn",
    "read_examples",
    "resolve_dtype",
]


def build_task(task_cfg: Any, tokenizer: Any | None = None) -> Task:
    """Build the reasoning task a config names.

    Args:
        task_cfg: a :class:`rltrain.config.schema.TaskConfig`.
        tokenizer: when given, every answer must encode without unknown tokens, so the model
            can produce it at all.

    Returns:
        The task.

    Raises:
        ConfigError: an unknown task name, an unreadable file, a reward function that cannot be
            imported, or answers the tokenizer cannot spell.
    """
    reward_fn = import_reward_fn(task_cfg.reward_fn) if task_cfg.reward_fn else exact_match
    common = {
        "num_eval": task_cfg.num_eval,
        "num_train": task_cfg.num_train,
        "reward_fn": reward_fn,
    }
    if task_cfg.name == "arithmetic":
        task = build_arithmetic_task(task_cfg.seed, task_cfg.max_operand, **common)
    elif task_cfg.name == "jsonl":
        if not task_cfg.path:
            raise ConfigError("task.name='jsonl' needs task.path: a local .jsonl or .parquet")
        task = build_file_task(
            task_cfg.path, task_cfg.seed, task_cfg.prompt_key, task_cfg.answer_key, **common
        )
    else:
        raise ConfigError(
            f"task.name={task_cfg.name!r} is not a reasoning task: choose 'arithmetic' or "
            f"'jsonl' (gym tasks run with runner=embodied)"
        )
    if tokenizer is not None:
        _check_spellable(task, tokenizer)
    return task


def _check_spellable(task: Task, tokenizer: Any) -> None:
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return
    for ex in (*task.train, *task.eval)[:10_000]:
        if unk in tokenizer(ex.answer, add_special_tokens=False)["input_ids"]:
            raise ConfigError(
                f"task {task.name!r}: answer {ex.answer!r} (prompt {ex.prompt!r}) has characters "
                f"the tokenizer does not know, so no response can earn its reward: add them to "
                f"model.vocab_chars or use a checkpoint's tokenizer (model.tokenizer_path)"
            )
