"""Built-in tasks, dataset files, the tokenizer and the tiny model (no download needed).

``build_task(task_cfg, tokenizer)`` gives a :class:`Task`: training and evaluation prompts
(rendered with the tokenizer's chat template when it has one), a deterministic
``sample_batch(step, batch_size)`` and ``reward(prompt, response)``. ``check_task(run)`` finds
every problem of a run's task before Ray starts. ``build_tokenizer(model_cfg)`` and
``build_model(model_cfg, dtype)`` give Hugging Face objects, built from config fields or loaded
from ``model.path``.
"""

from __future__ import annotations

from typing import Any

from rltrain.errors import ConfigError
from rltrain.tasks.arithmetic import arithmetic_examples, build_arithmetic_task
from rltrain.tasks.base import Example, RewardFn, Task, exact_match, import_reward_fn
from rltrain.tasks.build import REASONING_TASKS, assemble
from rltrain.tasks.chat import has_chat_template, render_prompts, use_chat_template
from rltrain.tasks.checks import (
    GENERATORS,
    check_task,
    planning_model,
    prepare_task,
    writes_nothing,
)
from rltrain.tasks.dataset import SUPPORTED, read_rows
from rltrain.tasks.file_task import build_file_task, read_examples
from rltrain.tasks.tokenizer import (
    DEFAULT_CHARS,
    build_char_tokenizer,
    build_tokenizer,
    tokenizer_source,
)

__all__ = [
    "DEFAULT_CHARS",
    "GENERATORS",
    "REASONING_TASKS",
    "SUPPORTED",
    "Example",
    "RewardFn",
    "Task",
    "arithmetic_examples",
    "build_arithmetic_task",
    "build_char_tokenizer",
    "build_file_task",
    "build_task",
    "build_tokenizer",
    "check_task",
    "exact_match",
    "has_chat_template",
    "import_reward_fn",
    "planning_model",
    "prepare_task",
    "read_examples",
    "read_rows",
    "render_prompts",
    "tokenizer_source",
    "use_chat_template",
    "writes_nothing",
]


def build_task(task_cfg: Any, tokenizer: Any | None = None, tokenizer_key: str = "") -> Task:
    """Build the reasoning task a config names.

    Args:
        task_cfg: a :class:`rltrain.config.schema.TaskConfig`.
        tokenizer: the model's tokenizer. With it, prompts go through its chat template
            (``task.chat_template``), must fit ``task.max_prompt_length`` tokens, and every
            answer must encode without unknown tokens (so the model can produce it at all).
            Without it prompts stay plain text and are not measured.
        tokenizer_key: where the tokenizer came from, for messages
            (:func:`tokenizer_source`).

    Returns:
        The task.

    Raises:
        ConfigError: every problem found (:func:`check_task` lists the same ones): an unknown
            task name, unreadable files or rows, a reward function that cannot be imported,
            prompts too long, answers the tokenizer cannot spell.
    """
    problems: list[str] = []
    task = assemble(task_cfg, tokenizer, problems, tokenizer_key)
    if problems or task is None:
        raise ConfigError(problems or [f"task.name={task_cfg.name!r}: no task could be built"])
    return task
