"""A task read from a local JSONL or Parquet file of prompt/answer records."""

from __future__ import annotations

import json
import os
from typing import Any

from rltrain.errors import ConfigError
from rltrain.tasks.base import Example, RewardFn, Task, exact_match, split_eval


def _check_record(record: Any, where: str, prompt_key: str, answer_key: str) -> Example:
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key, cfg_key in ((prompt_key, "task.prompt_key"), (answer_key, "task.answer_key")):
        if key not in record or record[key] is None:
            raise ConfigError(
                f"{where}: missing field {key!r} ({cfg_key}={key!r}); present fields: "
                f"{sorted(record)}. Add the field or set {cfg_key} to the field that holds it"
            )
    return Example(str(record[prompt_key]), str(record[answer_key]))


def _read_jsonl(path: str) -> list[tuple[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"task.path={path!r} line {lineno}"
            try:
                rows.append((where, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from None
    return rows


def _read_parquet(path: str) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"task.path={path!r} is a Parquet file but pyarrow is not installed: "
            f"pip install pyarrow, or convert the file to JSONL"
        ) from None
    records = pq.read_table(path).to_pylist()
    return [(f"task.path={path!r} row {i}", r) for i, r in enumerate(records)]


def read_examples(
    path: str, prompt_key: str = "prompt", answer_key: str = "answer"
) -> list[Example]:
    """Read prompt/answer pairs from a ``.jsonl`` or ``.parquet`` file.

    Args:
        path: the local file.
        prompt_key: the field holding the prompt.
        answer_key: the field holding the reference answer.

    Returns:
        The examples in file order.

    Raises:
        ConfigError: the file is missing, has an unknown suffix, a record is not valid JSON, or a
            record misses a field (the message names the line and the field).
    """
    if not os.path.isfile(path):
        raise ConfigError(f"task.path={path!r} does not exist: give a local .jsonl or .parquet")
    if path.endswith(".parquet"):
        rows = _read_parquet(path)
    elif path.endswith((".jsonl", ".json")):
        rows = _read_jsonl(path)
    else:
        raise ConfigError(f"task.path={path!r}: unknown file type; use .jsonl or .parquet")
    examples = [_check_record(r, where, prompt_key, answer_key) for where, r in rows]
    if not examples:
        raise ConfigError(f"task.path={path!r} holds no records")
    return examples


def build_file_task(
    path: str,
    seed: int,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    num_eval: int = 0,
    num_train: int = 0,
    reward_fn: RewardFn = exact_match,
) -> Task:
    """Build a task from a local file; see :func:`read_examples` for the format.

    Args:
        path: the ``.jsonl`` or ``.parquet`` file.
        seed: seeds the held-out split and the data order.
        prompt_key: the field holding the prompt.
        answer_key: the field holding the reference answer.
        num_eval: records held out for evaluation; 0 evaluates on the training records.
        num_train: training records to keep; 0 keeps all that are not held out.
        reward_fn: scores a response; exact match by default.

    Returns:
        The task.

    Raises:
        ConfigError: see :func:`read_examples`; also a prompt given twice with different answers.
    """
    examples = read_examples(path, prompt_key, answer_key)
    seen: dict[str, str] = {}
    for ex in examples:
        if seen.setdefault(ex.prompt, ex.answer) != ex.answer:
            raise ConfigError(
                f"task.path={path!r}: prompt {ex.prompt!r} appears with answers "
                f"{seen[ex.prompt]!r} and {ex.answer!r}; a prompt must have one answer"
            )
    train, evals, same = split_eval(examples, num_eval, num_train, seed)
    return Task("jsonl", train, evals, same, seed, reward_fn)
