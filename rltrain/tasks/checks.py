"""The task's checks before Ray starts: the data is opened and every row is looked at.

:func:`check_task` is what the driver runs (in training and in ``mode=plan``) after the config
checks and before any worker exists. It builds the task exactly as the workers will
(:func:`rltrain.tasks.build.assemble`) and returns every problem instead of stopping at the
first, so one run of the command lists everything to fix.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from rltrain.errors import ConfigError
from rltrain.kinds import registry
from rltrain.tasks.build import assemble, collect, read_sources
from rltrain.tasks.calc_tool import ALPHABET, CalcToolSpec, ensure_calc_tool
from rltrain.tasks.gsm8k_tiny import Gsm8kTinySpec, ensure_gsm8k_tiny
from rltrain.tasks.text_env import env_problems
from rltrain.tasks.tokenizer import build_tokenizer, tokenizer_source

#: ``task.generate`` values: the data sets rltrain can write itself.
GENERATORS = ("gsm8k_tiny", "calc_tool")


def writes_nothing(run: Any) -> bool:
    """Whether the run only plans: ``mode=plan`` writes its plan files and nothing else.

    ``placement=auto`` profiles short runs of the task to plan, so it needs the task's data:
    there ``mode=plan`` writes it (the help says so).
    """
    return run.mode == "plan" and run.placement.mode != "auto"


def prepare_task(run: Any) -> bool:
    """Write the synthetic data ``task.generate`` names, unless it is already there.

    ``task.generate=gsm8k_tiny`` writes the training and evaluation Parquet files to
    ``task.path`` and ``task.eval_path`` and a base chat checkpoint (model and tokenizer) to
    ``model.path``, built from the ``model`` fields (:mod:`rltrain.tasks.gsm8k_tiny`); sizes
    come from ``task.params``. It never writes over a checkpoint or file it did not write
    itself, and writes nothing at all when the run only plans (:func:`writes_nothing`). Safe
    to call from several processes at once (a file lock), and cheap when the data is current.

    Args:
        run: a :class:`rltrain.config.schema.RunConfig`.

    Returns:
        True when the data was missing or stale: written now, or (when the run only plans)
        still to be written by a run.

    Raises:
        ConfigError: an unknown generator, a path it needs left unset, a path holding what the
            generator did not write, bad ``task.params``.
    """
    t = run.task
    generate = t.generate
    if not generate:
        return False
    problems = _generator_problems(run)
    if problems:
        raise ConfigError(problems)
    try:
        if generate == "calc_tool":
            spec_calc = CalcToolSpec.from_params(dict(t.params), t.seed)
            return ensure_calc_tool(
                t.path,
                t.eval_path,
                run.model.path,
                spec_calc,
                run.model,
                writes_nothing(run),
                progress=run.logging.progress,
            )
        spec = Gsm8kTinySpec.from_params(dict(t.params), t.seed)
        chat = t.chat_template is not False  # null: the generated tokenizer has a template
        return ensure_gsm8k_tiny(
            t.path,
            t.eval_path,
            run.model.path,
            spec,
            run.model,
            t.system_prompt,
            chat,
            dry_run=writes_nothing(run),
            progress=run.logging.progress,
        )
    except OSError as exc:
        raise ConfigError(
            f"task.generate={generate!r} could not write its data ({exc}): point "
            f"task.params.data_dir (or task.path / task.eval_path / model.path) at a "
            f"writable directory"
        ) from None


def _generator_problems(run: Any) -> list[str]:
    """What stops ``task.generate`` before it looks at its paths."""
    t, generate = run.task, run.task.generate
    if generate not in GENERATORS:
        return [
            f"task.generate={generate!r} is not a generator rltrain has: choose one of "
            f"{list(GENERATORS)}, or null to read existing files"
        ]
    paths = {"task.path": t.path, "task.eval_path": t.eval_path, "model.path": run.model.path}
    problems = [
        f"task.generate={generate!r} writes its data to {key}, which is not set: give it a "
        f"path (experiment=gsm8k_tiny sets all three under task.params.data_dir)"
        for key, value in paths.items()
        if not value
    ]
    problems += _overlapping(generate, {k: v for k, v in paths.items() if v})
    if t.name != "jsonl":
        problems.append(
            f"task.generate={generate!r} writes data files, read with task.name='jsonl' "
            f"(got task.name={t.name!r})"
        )
    if run.model.tokenizer_path:
        problems.append(
            f"task.generate={generate!r} writes model.path with its own tokenizer, but "
            f"model.tokenizer_path={run.model.tokenizer_path!r} would replace it: set "
            f"model.tokenizer_path=null (or task.generate=null to use your own checkpoint)"
        )
    return problems


def _params_without_a_generator(t: Any) -> list[str]:
    """``task.params`` keys no generator has, when ``task.generate`` is null.

    With ``task.generate=null`` ``task.params`` is not read; a generator's settings there are
    let through (``experiment=gsm8k_tiny task.generate=null`` keeps its preset's), but a key
    no generator has is a misspelling that would otherwise go unnoticed.
    """
    if t.generate is not None or not t.params:
        return []
    known = {"data_dir"} | {
        f.name for spec in (Gsm8kTinySpec, CalcToolSpec) for f in dataclasses.fields(spec)
    }
    known.discard("seed")
    return [
        f"task.params.{key}={t.params[key]!r} is not a setting of any task.generate (settings: "
        f"{sorted(known)}); with task.generate=null task.params is not read: fix the key or "
        f"drop it"
        for key in t.params
        if key not in known
    ]


def _overlapping(generate: str, paths: dict[str, str]) -> list[str]:
    """Output paths that are the same, or one inside the checkpoint directory (the generator
    would write one over the other)."""
    where = {k: os.path.abspath(v) for k, v in paths.items()}
    model = where.pop("model.path", None)
    problems = []
    if len(set(where.values())) < len(where):
        problems.append(
            f"task.generate={generate!r} writes task.path and task.eval_path, but both are "
            f"{next(iter(where.values()))!r}: give them different files"
        )
    for key, path in where.items():
        if model is not None and (path == model or path.startswith(model.rstrip(os.sep) + os.sep)):
            problems.append(
                f"task.generate={generate!r} writes {key}={paths[key]!r} inside model.path="
                f"{paths['model.path']!r}, which it replaces whole: put the data elsewhere"
            )
    return problems


def planning_model(run: Any) -> Any:
    """The ``model`` section the plan is sized from.

    Where ``task.generate`` has not written the checkpoint at ``model.path`` yet (a run that
    only plans writes nothing), the plan is sized from the model the generator would build:
    the ``model`` fields, with the generated tokenizer's vocabulary.

    Args:
        run: a :class:`rltrain.config.schema.RunConfig` that passed the config checks.

    Returns:
        ``run.model``, or the model the generator would build.

    Raises:
        ConfigError: what :func:`prepare_task` refuses.
    """
    if not (run.task.generate and registry.runner(run).language_model and writes_nothing(run)):
        return run.model  # a run writes the checkpoint before it is planned
    if not prepare_task(run):  # (only looks: the run only plans)
        return run.model
    if run.task.generate == "calc_tool":  # the character tokenizer: pad, eos, unk + ALPHABET
        generated = len(ALPHABET) + 3
    else:
        generated = Gsm8kTinySpec.from_params(dict(run.task.params), 0).vocab_size
    vocab = run.model.vocab_size or generated
    return dataclasses.replace(run.model, path=None, tokenizer_path=None, vocab_size=vocab)


def check_task(run: Any) -> list[str]:
    """Every problem of a reasoning run's task, found without Ray: none means it will load.

    Writes ``task.generate``'s data first (:func:`prepare_task`), loads the tokenizer, opens
    the dataset files and looks at every row: missing, empty, binary or malformed files
    (file and line), unsupported types, rows missing the prompt or answer field (file, row,
    field), message-list prompts without a chat template, prompts over
    ``task.max_prompt_length`` tokens after the chat template, a longest prompt that with the
    response budget overruns the model's context, answers with characters the
    tokenizer cannot spell, a prompt given with two answers, ``task.reward_fn`` that cannot be
    imported, split sizes that leave nothing to train on. Reads 100k-row files in seconds.

    Args:
        run: a :class:`rltrain.config.schema.RunConfig` that passed the config checks.

    Returns:
        The problem messages (each names the key, the value and the fix); empty when the task
        builds. Embodied runs (``task.name=gym``) have none here.
    """
    if run.runner != "reasoning" or run.task.name == "gym":
        return []
    env = env_problems(run) + _params_without_a_generator(run.task)
    if env:  # task.env, the multi-turn keys and task.params: before writing any data
        return env
    try:
        missing = prepare_task(run)
    except ConfigError as exc:
        return list(exc.problems)
    if missing and writes_nothing(run):
        return []  # mode=plan wrote nothing: the run writes the data, then checks it
    problems: list[str] = []
    tokenizer = collect(problems, lambda: build_tokenizer(run.model))
    if tokenizer is None:  # still report what is wrong with the files themselves
        if run.task.reward_fn:
            from rltrain.tasks.base import import_reward_fn

            collect(problems, lambda: import_reward_fn(run.task.reward_fn))
        read_sources(run.task, problems)
        return problems
    size = run.model.vocab_size
    built = run.model.path is None or bool(run.task.generate)
    if built and size is not None and size < len(tokenizer):
        problems.append(
            f"model.vocab_size={size} is smaller than the tokenizer's {len(tokenizer)} tokens "
            f"({tokenizer_source(run.model)}): give at least {len(tokenizer)}, or null for "
            f"exactly the tokenizer's size"
        )
    task = assemble(run.task, tokenizer, problems, tokenizer_source(run.model))
    if task is not None and not problems:
        from rltrain.tasks.context import context_problems
        from rltrain.tasks.reward_check import reward_problems

        problems += collect(problems, lambda: context_problems(run, task, tokenizer)) or []
        problems += reward_problems(run, task, tokenizer)
    return problems
