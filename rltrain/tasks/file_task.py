"""A task read from local dataset files (``task.name=jsonl``): JSONL, JSON, Parquet or a
``datasets.save_to_disk`` directory, through :mod:`rltrain.tasks.dataset`."""

from __future__ import annotations

from types import SimpleNamespace

from rltrain.errors import ConfigError
from rltrain.tasks.base import Example, RewardFn, Task, exact_match
from rltrain.tasks.chat import render_prompts
from rltrain.tasks.dataset import read_rows


def read_examples(
    path: str, prompt_key: str = "prompt", answer_key: str = "answer"
) -> list[Example]:
    """Read string prompt/answer pairs from a local dataset file.

    Args:
        path: a ``.jsonl`` / ``.json`` / ``.parquet`` file or a ``save_to_disk`` directory.
        prompt_key: the field holding the prompt.
        answer_key: the field holding the reference answer.

    Returns:
        The examples in file order.

    Raises:
        ConfigError: see :func:`rltrain.tasks.dataset.read_rows`; also message-list prompts
            (they need a tokenizer's chat template: use :func:`rltrain.tasks.build_task`).
    """
    rows = read_rows(path, prompt_key, answer_key)
    prompts = render_prompts(rows.prompts, None, chat=False, where=rows.where)
    return [Example(p, a) for p, a in zip(prompts, rows.answers, strict=True)]


def build_file_task(
    path: str,
    seed: int,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    num_eval: int = 0,
    num_train: int = 0,
    reward_fn: RewardFn = exact_match,
) -> Task:
    """Build a task from one local file, prompts as plain text (no tokenizer, no template).

    Args:
        path: the dataset file or directory.
        seed: seeds the held-out split and the data order.
        prompt_key: the field holding the prompt.
        answer_key: the field holding the reference answer.
        num_eval: records held out for evaluation; 0 evaluates on the training records.
        num_train: training records to keep; 0 keeps all that are not held out.
        reward_fn: scores a response; exact match by default.

    Returns:
        The task.

    Raises:
        ConfigError: every problem of the file (see :func:`rltrain.tasks.build_task`).
    """
    from rltrain.tasks.build import assemble

    cfg = SimpleNamespace(
        name="jsonl",
        path=path,
        eval_path=None,
        prompt_key=prompt_key,
        answer_key=answer_key,
        num_eval=num_eval,
        num_train=num_train,
        seed=seed,
        reward_fn=None,
        chat_template=False,
        system_prompt=None,
        max_prompt_length=0,
    )
    problems: list[str] = []
    task = assemble(cfg, None, problems)
    if problems or task is None:
        raise ConfigError(problems or [f"task.path={path!r}: no task could be built"])
    return Task(task.name, task.train, task.eval, task.eval_is_train, seed, reward_fn)
