"""The reward, tried before Ray starts: can it be called, and can it ever pay?

A reward that raises, returns no number, or pays nothing for any answer the policy could write
would train on zeros for the whole run. :func:`reward_problems` scores a few training rows with
correct responses in every spelling a rule reward reads (the reference itself, ``#### n``,
``\\boxed{n}``), each as the tokenizer would write it back within ``rollout.max_new_tokens``
tokens, against an empty response. When no spelling of any row pays more than the empty one:

- if an unwritten spelling would pay, the tokenizer cannot write it: the characters it loses
  are named (refused);
- else the reward does not read the dataset's answers: the built-in rewards that do are named
  (refused for rltrain's own rewards; a warning for a user's function, whose convention rltrain
  cannot know).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rltrain")

#: Training rows scored (the first ones of the task's order, so every run checks the same).
PROBES = 8

#: rltrain's rule rewards, tried on the answers to suggest the one that reads them.
BUILT_IN = {
    "exact match (task.reward_fn=null)": "rltrain.tasks.base:exact_match",
    "task.reward_fn=rltrain.rewards.math:gsm8k": "rltrain.rewards.math:gsm8k",
    "task.reward_fn=rltrain.rewards.math:boxed": "rltrain.rewards.math:boxed",
}


@dataclass(frozen=True)
class Spelling:
    """One correct response to a row: as meant, and as the tokenizer writes it back."""

    text: str
    written: str
    tokens: int


def spellings(answer: str, tokenizer: Any) -> list[Spelling]:
    """Correct responses to a row whose reference answer is ``answer``, in the conventions rule
    rewards read, each with what the tokenizer makes of it (None: taken as written)."""
    from rltrain.rewards.math import extract_boxed, extract_hash_answer

    bare = extract_hash_answer(answer) or extract_boxed(answer) or answer.strip()
    texts = dict.fromkeys([answer, bare, f"#### {bare}", f"\\boxed{{{bare}}}"])
    out = []
    for text in texts:
        if tokenizer is None:
            out.append(Spelling(text, text, 0))
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(Spelling(text, tokenizer.decode(ids, skip_special_tokens=True), len(ids)))
    return out


def _score(fn: Callable[..., Any], prompt: str, response: str, answer: str) -> float:
    """The reward as a float.

    Raises:
        TypeError / ValueError: it returned no finite number (raised errors pass through).
    """
    value = fn(prompt, response, answer)
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"returned {value!r} ({type(value).__name__}), not a float") from None
    if not math.isfinite(value):
        raise ValueError(f"returned {value!r}, not a finite number")
    return float(value)


def reward_problems(run: Any, task: Any, tokenizer: Any) -> list[str]:
    """Problems of the run's reward on its task (warnings for a user's reward are logged).

    Args:
        run: the :class:`~rltrain.config.schema.RunConfig`.
        task: the built :class:`~rltrain.tasks.base.Task`.
        tokenizer: the model's tokenizer (None: spellings are taken as written).

    Returns:
        Problem messages naming ``task.reward_fn``, the row, the value and the fix.
    """
    from rltrain.config.validate import reward_signature_problem

    spec = run.task.reward_fn
    key = f"task.reward_fn={spec!r}" if spec else "the task's reward (exact match)"
    if spec and (problem := reward_signature_problem("task.reward_fn", spec, task.reward_fn)):
        return [problem]  # not called: it cannot take the arguments
    budget = run.rollout.max_new_tokens
    rows = list(task.train[:PROBES])
    lost: dict[str, tuple[Spelling, str]] = {}
    too_long: list[Spelling] = []
    for ex in rows:
        try:
            empty = _score(task.reward_fn, ex.prompt, "", ex.answer)
            for s in spellings(ex.answer, tokenizer):
                pays = _score(task.reward_fn, ex.prompt, s.written, ex.answer) > empty
                if pays and (tokenizer is None or s.tokens <= budget):
                    return []  # some row can be paid
                if pays:
                    too_long.append(s)
                elif s.written != s.text:
                    if _score(task.reward_fn, ex.prompt, s.text, ex.answer) > empty:
                        lost.setdefault(s.text, (s, ex.answer))
        except Exception as exc:  # noqa: BLE001 - any failure of the user's function is reported
            return [
                f"{key} failed scoring the prompt {ex.prompt!r:.60} with its reference answer "
                f"{ex.answer!r:.60} as the response: {type(exc).__name__}: {exc}; fix the "
                f"function: it is called as reward_fn(prompt, response, answer) -> float"
            ]
    return _never_pays(run, key, rows, lost, too_long, budget)


def _never_pays(
    run: Any,
    key: str,
    rows: list[Any],
    lost: dict[str, tuple[Spelling, str]],
    too_long: list,
    budget: int,
) -> list[str]:
    """The problem (or warning) of a reward no correct response can earn."""
    answer = rows[0].answer if rows else ""
    if lost:
        s, answer = next(iter(lost.values()))
        missing = sorted({c for c in s.text if c not in s.written})
        return [
            f"{key} can never pay: it rewards {s.text!r} for the answer {answer!r:.60}, but "
            f"the tokenizer writes that as {s.written!r} (it cannot write "
            f"{missing}): use a tokenizer that has them (model.path / model.tokenizer_path, or "
            f"add them to model.vocab_chars for the built-in one), or a reward the tokenizer "
            f"can earn"
        ]
    if too_long:
        s = min(too_long, key=lambda x: x.tokens)
        return [
            f"{key} can never pay within rollout.max_new_tokens={budget}: the shortest correct "
            f"response it rewards, {s.text!r:.60}, is {s.tokens} tokens: raise "
            f"rollout.max_new_tokens to at least {s.tokens}"
        ]
    readers = _readers(rows)
    text = (
        f"{key} pays nothing for any spelling of the reference answers of {len(rows)} training "
        f"rows (e.g. {answer!r:.60} as itself, '#### n' or '\\boxed{{n}}'), so no response "
        f"would ever be rewarded: "
        + (
            f"the answers are read by {' or '.join(readers)}; use that, or"
            if readers
            else "check task.answer_key and"
        )
        + " a reward that reads the dataset's answer format"
    )
    spec = run.task.reward_fn
    if spec and not spec.startswith("rltrain."):
        log.warning("%s (a warning: your function may want another convention)", text)
        return []
    return [text]


def _readers(rows: list[Any]) -> list[str]:
    """The built-in rewards that pay a correct spelling of every probed row."""
    from rltrain.tasks.base import import_reward_fn

    out = []
    for name, spec in BUILT_IN.items():
        fn = import_reward_fn(spec)
        if rows and all(_pays_some_spelling(fn, ex) for ex in rows):
            out.append(name)
    exact = next(iter(BUILT_IN))
    return [n for n in out if n != exact] or out  # a marker convention first


def _pays_some_spelling(fn: Callable[..., Any], ex: Any) -> bool:
    empty = fn(ex.prompt, "", ex.answer)
    return any(fn(ex.prompt, s.text, ex.answer) > empty for s in spellings(ex.answer, None))
