"""Assemble a reasoning task from its config, collecting every problem on the way.

One pass serves both :func:`rltrain.tasks.build_task` (raises when anything is wrong) and
:func:`rltrain.tasks.check_task` (reports everything before Ray starts): read the rows, render
the prompts (chat template), measure them in tokens, check the answers can be spelled, split
train and evaluation. Each stage records what it finds and the next stages run on what is
usable, so a user sees every problem of a dataset at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.errors import ConfigError
from rltrain.tasks.arithmetic import arithmetic_examples
from rltrain.tasks.base import Example, RewardFn, Task, exact_match, import_reward_fn, split_eval
from rltrain.tasks.chat import conversation, render_prompts, use_chat_template
from rltrain.tasks.dataset import MAX_LISTED, Rows, read_rows

log = logging.getLogger(__name__)
#: Evaluation files already reported as overlapping the training rows (once per process: the
#: driver's check, a reward worker and a rollout's evaluation each build the task).
_OVERLAP_NOTED: set[tuple[str, str]] = set()

#: ``task.name`` values that are reasoning tasks (``gym`` runs with ``runner=embodied``).
REASONING_TASKS = ("arithmetic", "jsonl")

#: Prompts tokenised per call when measuring them (bounds the memory of one call).
CHUNK = 4096


@dataclass
class Source:
    """Rows of one split before they become examples.

    Attributes:
        key: the config key that named them (``task.path``, ``task.eval_path``, ``task.name``).
        prompts: raw prompts (strings or message lists), then rendered text.
        answers: reference answers.
        where: names row ``i`` in messages.
    """

    key: str
    prompts: list[Any]
    answers: list[str]
    where: Callable[[int], str]


def collect(problems: list[str], fn: Callable[[], Any]) -> Any:
    """``fn()``, or None with its ConfigError's problems added to ``problems``.

    Args:
        problems: receives the problems of a :class:`ConfigError` ``fn`` raises.
        fn: the step to run.

    Returns:
        What ``fn`` returned, or None when it raised a :class:`ConfigError`.
    """
    try:
        return fn()
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None


def read_sources(cfg: Any, problems: list[str]) -> tuple[Source | None, Source | None]:
    """The training rows and, with ``task.eval_path``, the evaluation rows.

    Args:
        cfg: a :class:`rltrain.config.schema.TaskConfig`.
        problems: receives every problem of the files and their rows.

    Returns:
        ``(train, eval)``; either is None when it could not be read (or, for eval, is not
        configured).
    """
    eval_path = cfg.eval_path
    if cfg.name == "arithmetic":
        if eval_path:
            problems.append(
                f"task.eval_path={eval_path!r} is for task.name='jsonl'; the arithmetic task "
                f"holds prompts out with task.num_eval"
            )
        examples = collect(problems, lambda: arithmetic_examples(cfg.max_operand))
        if examples is None:
            return None, None
        return Source(
            "task.name",
            [e.prompt for e in examples],
            [e.answer for e in examples],
            lambda i: f"task.name='arithmetic' prompt {examples[i].prompt!r}",
        ), None
    if not cfg.path:
        problems.append(
            "task.name='jsonl' needs task.path: a local .jsonl, .json or .parquet file or a "
            "datasets.save_to_disk directory"
        )
        return None, None

    def read(path: str, key: str) -> Source | None:
        rows: Rows | None = collect(
            problems, lambda: read_rows(path, cfg.prompt_key, cfg.answer_key, key)
        )
        if rows is None:
            return None
        return Source(key, list(rows.prompts), list(rows.answers), rows.where)

    train = read(cfg.path, "task.path")
    evals = read(eval_path, "task.eval_path") if eval_path else None
    if eval_path and cfg.num_eval:
        problems.append(
            f"task.num_eval={cfg.num_eval} with task.eval_path={eval_path!r}: the evaluation "
            f"rows come from the file, so set task.num_eval=0 (or drop task.eval_path to hold "
            f"rows of task.path out)"
        )
    return train, evals


def _render(
    sources: Sequence[Source], cfg: Any, tokenizer: Any, tokenizer_key: str, problems: list[str]
) -> bool:
    """Render every source's prompts in place; False when that was impossible."""
    system_prompt = cfg.system_prompt
    chat = collect(
        problems,
        lambda: use_chat_template(cfg.chat_template, tokenizer, tokenizer_key),
    )
    if chat is None:
        return False
    ok = True
    for src in sources:
        rendered = collect(
            problems,
            lambda src=src: render_prompts(src.prompts, tokenizer, chat, system_prompt, src.where),
        )
        if rendered is None:
            ok = False
            if system_prompt and not chat:
                break  # the same sentence for every source
        else:
            src.prompts = rendered
    return ok


def _measure(
    sources: Sequence[Source], tokenizer: Any, max_len: int, problems: list[str]
) -> dict[str, str]:
    """Refuse prompts over ``task.max_prompt_length`` tokens and prompts the reward cannot tell
    apart; return the prompts' aliases.

    The reward worker reads a prompt back from its token ids without special tokens; where
    that differs from the rendered text (a chat template's ``<|im_start|>``, characters the
    tokenizer maps to its unknown token), the task maps it back (:attr:`Task.aliases`). Every
    prompt is read back exactly: no cheaper rule holds for every tokenizer (normalisers,
    unknown characters), and straight through the Rust backend it costs about half a CPU
    second per 10k prompts. Distinct prompts that read back as one text but have different
    answers would all be scored against one of the answers, so they are refused.
    """
    from rltrain.tasks.tokenizer import prompt_token_ids

    aliases: dict[str, str] = {}
    readers: dict[str, list[tuple[Source, int]]] = {}  # read-back -> the rows that read so
    for src in sources:
        too_long: list[tuple[int, int]] = []
        for start in range(0, len(src.prompts), CHUNK):
            chunk = src.prompts[start : start + CHUNK]
            ids = prompt_token_ids(tokenizer, chunk)
            read = _decode_without_specials(tokenizer, ids)
            for i, (prompt, back, row) in enumerate(zip(chunk, read, ids, strict=True), start):
                if len(row) > max_len:
                    too_long.append((i, len(row)))
                if back != prompt:
                    aliases.setdefault(back, prompt)
                readers.setdefault(back, []).append((src, i))
        for i, n in too_long[:MAX_LISTED]:
            problems.append(
                f"{src.where(i)}: the prompt is {n} tokens (chat template applied), over "
                f"task.max_prompt_length={max_len}: raise task.max_prompt_length (the plan "
                f"sizes memory from it) or drop the row"
            )
        if len(too_long) > MAX_LISTED:
            problems.append(
                f"{src.key}: {len(too_long) - MAX_LISTED} more prompts over "
                f"task.max_prompt_length={max_len} ({len(too_long)} of {len(src.prompts)})"
            )
    _refuse_collisions(readers, problems)
    return aliases


def _refuse_collisions(readers: dict[str, list[tuple[Source, int]]], problems: list[str]) -> None:
    """Refuse distinct prompts that read back as one text but have different answers."""
    clashes = []
    for back, rows in readers.items():
        a_src, a = rows[0]
        for b_src, b in rows[1:]:
            # one prompt with two answers is :func:`_examples`' problem, named there
            if b_src.answers[b] != a_src.answers[a] and b_src.prompts[b] != a_src.prompts[a]:
                clashes.append((back, a_src, a, b_src, b))
                break
    for back, a_src, a, b_src, b in clashes[:MAX_LISTED]:
        problems.append(
            f"{a_src.where(a)} and {b_src.where(b)}: the prompts differ but both read back from "
            f"their token ids as {back!r:.80} (the tokenizer cannot spell all their characters), "
            f"and their answers differ ({a_src.answers[a]!r:.40} and {b_src.answers[b]!r:.40}), "
            f"so the reward cannot tell them apart: use a tokenizer that spells them (add the "
            f"characters to model.vocab_chars, or set model.tokenizer_path) or drop one row"
        )
    if len(clashes) > MAX_LISTED:
        problems.append(f"{len(clashes) - MAX_LISTED} more prompts read back like these")


def _decode_without_specials(tokenizer: Any, ids: list[list[int]]) -> list[str]:
    """``tokenizer.batch_decode(ids, skip_special_tokens=True)``, the reward worker's reading.

    A fast tokenizer that does no clean-up decodes straight through its Rust backend: the same
    text, without ``batch_decode``'s per-token conversions (most of the time on 100k rows).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return backend.decode_batch(ids, skip_special_tokens=True)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def _spellable(
    sources: Sequence[Source], tokenizer: Any, reward_fn: RewardFn, problems: list[str]
) -> None:
    """Refuse answers whose winning response holds characters the tokenizer maps to its
    unknown token.

    The text checked is what a response must spell to earn the full reward: the reward
    function's ``full_reward_response(answer)`` where it has one (the math rewards: ``#### 7``
    for a whole GSM8K solution, whose prose is never generated), else the answer itself.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return  # byte-level tokenizers spell everything
    spelled = getattr(reward_fn, "full_reward_response", None) or (lambda answer: answer)
    for src in sources:
        unique = sorted(set(src.answers))
        bad_answers: dict[str, str] = {}
        for start in range(0, len(unique), CHUNK):
            chunk = unique[start : start + CHUNK]
            texts = [spelled(a) for a in chunk]
            ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
            bad_answers |= {a: t for a, t, r in zip(chunk, texts, ids, strict=True) if unk in r}
        if not bad_answers:
            continue
        bad = [i for i, a in enumerate(src.answers) if a in bad_answers]
        name = f"{getattr(reward_fn, '__module__', '?')}:{getattr(reward_fn, '__name__', '?')}"
        for i in bad[:MAX_LISTED]:
            answer = src.answers[i]
            text = bad_answers[answer]
            reads = "" if text == answer else f" (task.reward_fn={name} pays for {text!r:.40})"
            unknown = [
                c
                for c in dict.fromkeys(text)
                if unk in tokenizer(c, add_special_tokens=False)["input_ids"]
            ]
            problems.append(
                f"{src.where(i)}: answer {answer!r:.80}{reads} has characters the tokenizer "
                f"does not know ({', '.join(map(repr, unknown))}), so no response can earn its "
                f"reward: add them to model.vocab_chars or use a checkpoint's tokenizer "
                f"(model.tokenizer_path)"
            )
        if len(bad) > MAX_LISTED:
            problems.append(f"{src.key}: {len(bad) - MAX_LISTED} more answers like these")


def _examples(src: Source, raw: Sequence[Any], problems: list[str], seen: dict) -> list[Example]:
    """The source's examples; a prompt given twice with different answers is a problem."""
    out = []
    for i, (prompt, answer) in enumerate(zip(src.prompts, src.answers, strict=True)):
        first = seen.setdefault(prompt, (answer, src.where(i)))
        if first[0] != answer:
            problems.append(
                f"{src.where(i)}: prompt {raw[i]!r:.80} appears with answers {first[0]!r} "
                f"({first[1]}) and {answer!r}; a prompt must have one answer"
            )
        out.append(Example(prompt, answer))
    return out


def assemble(cfg: Any, tokenizer: Any, problems: list[str], tokenizer_key: str = "") -> Task | None:
    """Build the task a ``task`` config describes, adding every problem found to ``problems``.

    Args:
        cfg: a :class:`rltrain.config.schema.TaskConfig`.
        tokenizer: the model's tokenizer, or None (no chat template, no length or spelling
            checks: unit tests and the plain reference loop).
        problems: receives every problem message.
        tokenizer_key: where the tokenizer came from, for messages.

    Returns:
        The task, or None when a problem made it impossible.
    """
    before = len(problems)
    reward_fn: RewardFn = exact_match
    if cfg.reward_fn:
        reward_fn = collect(problems, lambda: import_reward_fn(cfg.reward_fn)) or exact_match
    if cfg.name not in REASONING_TASKS:
        problems.append(
            f"task.name={cfg.name!r} is not a reasoning task: choose one of "
            f"{list(REASONING_TASKS)} (gym tasks run with runner=embodied)"
        )
        return None
    train, evals = read_sources(cfg, problems)
    sources = [s for s in (train, evals) if s is not None]
    raw = {s.key: list(s.prompts) for s in sources}
    rendered = _render(sources, cfg, tokenizer, tokenizer_key, problems)
    aliases: dict[str, str] = {}
    if tokenizer is not None and rendered:
        aliases = _measure(sources, tokenizer, cfg.max_prompt_length, problems)
    if tokenizer is not None:
        _spellable(sources, tokenizer, reward_fn, problems)
    if train is None or not rendered:
        return None
    seen: dict[str, tuple[str, str]] = {}
    train_ex = _examples(train, raw[train.key], problems, seen)
    eval_ex = _examples(evals, raw[evals.key], problems, seen) if evals is not None else None
    if eval_ex is not None:
        split = collect(problems, lambda: split_eval(train_ex, 0, cfg.num_train, cfg.seed))
    else:
        split = collect(
            problems, lambda: split_eval(train_ex, cfg.num_eval, cfg.num_train, cfg.seed)
        )
    if split is None or len(problems) > before:
        return None
    kept, held, same = split
    if eval_ex is not None:
        held, same = tuple(eval_ex), False
        _note_overlap(cfg, kept, held)
    return collect(problems, lambda: Task(cfg.name, kept, held, same, cfg.seed, reward_fn, aliases))


def _note_overlap(cfg: Any, train: Sequence[Example], evals: Sequence[Example]) -> None:
    """Warn when ``task.eval_path`` holds prompts the run also trains on: its
    ``eval/accuracy`` is then not a held-out figure for them (kept: evaluating on training
    prompts can be what a user wants)."""
    evaluated = {e.prompt for e in evals}
    shared = len(evaluated & {e.prompt for e in train})
    key = (str(cfg.path), str(cfg.eval_path))
    if shared and key not in _OVERLAP_NOTED:
        _OVERLAP_NOTED.add(key)
        log.warning(
            "task.eval_path=%r: %d of its %d prompts are also training prompts (task.path=%r), "
            "so eval/accuracy is not held-out for them; give evaluation rows the run does not "
            "train on for a held-out figure",
            cfg.eval_path,
            shared,
            len(evaluated),
            cfg.path,
        )


def prompt_conversations(
    cfg: Any, tokenizer: Any, tokenizer_key: str = ""
) -> dict[str, list[dict[str, str]]]:
    """Each of the task's prompts, as the policy is given it, mapped to the conversation it was
    rendered from (a reward model with a chat template of its own renders that conversation
    again: ``reward.kind=model``).

    A string prompt is one user message; with the chat template ``task.system_prompt`` goes
    first, as :func:`~rltrain.tasks.chat.render_prompts` puts it.

    Args:
        cfg: a :class:`rltrain.config.schema.TaskConfig`.
        tokenizer: the policy's tokenizer.
        tokenizer_key: where the tokenizer came from, for messages.

    Returns:
        Rendered prompt -> its messages (``{role, content}``), for the training and evaluation
        prompts.

    Raises:
        ConfigError: the task's rows cannot be read or rendered (as :func:`assemble` reports).
    """
    problems: list[str] = []
    sources = [s for s in read_sources(cfg, problems) if s is not None]
    raw = [list(s.prompts) for s in sources]
    chat = collect(problems, lambda: use_chat_template(cfg.chat_template, tokenizer, tokenizer_key))
    _render(sources, cfg, tokenizer, tokenizer_key, problems)
    if problems:
        raise ConfigError(problems)
    system = cfg.system_prompt if chat else None
    out: dict[str, list[dict[str, str]]] = {}
    for src, prompts in zip(sources, raw, strict=True):
        for rendered, prompt in zip(src.prompts, prompts, strict=True):
            if rendered not in out:
                out[rendered] = conversation(prompt, system)
    return out
