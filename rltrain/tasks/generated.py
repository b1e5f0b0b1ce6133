"""What the built-in generators (``task.generate``) share: their ``task.params`` read into a
spec, their stamps, and writing only where they wrote before, under a lock that lets the jobs
of one sweep prepare the same outputs at once.

Pure standard library; no torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any

from rltrain.errors import ConfigError


def spec_values(cls: Any, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The fields of the spec dataclass ``cls`` that ``task.params`` sets, type-checked.

    ``task.params`` holds the generator's settings and ``data_dir`` (the experiment presets
    put ``task.path`` and ``model.path`` under it); any other key is refused, as a misspelt
    setting would otherwise be ignored. ``seed`` comes from the run (``task.seed``).

    Args:
        cls: the generator's spec dataclass (int, float and bool fields).
        params: ``task.params``.
        seed: the run's seed.

    Returns:
        Keyword arguments for ``cls``.

    Raises:
        ConfigError: a key that is not one of those, or a value of the wrong type (a bool for
            a number, a string, a non-finite float, a number for a bool), naming
            ``task.params.<name>``.
    """
    values: dict[str, Any] = {"seed": seed}
    known = [f.name for f in fields(cls) if f.name != "seed"] + ["data_dir"]
    generator = getattr(cls, "generator", "")
    problems = [
        f"task.params.{name}={params[name]!r} is not a setting of task.generate="
        f"{generator!r}: "
        + ("the generator's seed is task.seed" if name == "seed" else f"its settings are {known}")
        + "; fix the key or drop it"
        for name in params
        if name not in known
    ]
    for f in fields(cls):
        if f.name == "seed" or f.name not in params:
            continue
        v = params[f.name]
        if f.type == "bool":
            if not isinstance(v, bool):
                problems.append(f"task.params.{f.name}={v!r} must be true or false")
            else:
                values[f.name] = v
            continue
        number = f.type == "float" and isinstance(v, (int, float)) and math.isfinite(v)
        if isinstance(v, bool) or not (isinstance(v, int) or number):
            kind = "a finite number" if f.type == "float" else "an integer"
            problems.append(f"task.params.{f.name}={v!r} must be {kind}")
        else:
            values[f.name] = float(v) if f.type == "float" else v
    if problems:
        raise ConfigError(problems)
    return values


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive lock on ``path`` (jobs of one sweep may prepare the same data at once)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def checked_spec(cls: Any, params: dict[str, Any], seed: int) -> Any:
    """The spec ``cls`` read from ``task.params`` (:func:`spec_values`) and range-checked by
    its ``problems()``.

    Raises:
        ConfigError: a value of the wrong type or out of range.
    """
    spec = cls(**spec_values(cls, params, seed))
    problems = spec.problems()
    if problems:
        raise ConfigError(problems)
    return spec


def held_stamp(model_dir: str, stamp_file: str, generator: str) -> dict[str, Any] | None:
    """The stamp ``generator`` left in ``model_dir``, or None (none, unreadable, another's)."""
    try:
        with open(os.path.join(model_dir, stamp_file)) as f:
            held = json.load(f)
    except (OSError, ValueError):
        return None
    return held if isinstance(held, dict) and held.get("generator") == generator else None


def ensure_written(
    model_dir: str,
    current: Callable[[], bool],
    foreign: Callable[[], list[str]],
    write: Callable[[], None],
    dry_run: bool,
) -> bool:
    """Write a generator's outputs unless they are current, never over what it did not write.

    The jobs of one sweep may prepare the same outputs at once: they take turns under a lock
    beside ``model_dir`` and look again once they hold it.

    Args:
        model_dir: the generated checkpoint's directory (the lock is ``<model_dir>.lock``).
        current: whether the outputs are there, as this run would write them.
        foreign: one message per output path holding something the generator did not write.
        write: writes every output (called under the lock, the paths checked).
        dry_run: only check (``mode=plan``): write nothing.

    Returns:
        True when something was written (with ``dry_run``: would be), False when current.

    Raises:
        ConfigError: ``foreign`` found something.
    """
    if current():
        return False
    lock = os.path.abspath(model_dir).rstrip("/") + ".lock"
    problems = foreign()
    if problems and not os.path.exists(lock):  # no generator ever wrote here: refuse untouched
        raise ConfigError(problems)
    if dry_run and not problems:
        return True
    with locked(lock):  # another job may be writing them now: wait for it, then look again
        if current():
            return False
        problems = foreign()
        if problems:
            raise ConfigError(problems)
        if not dry_run:
            write()
    return True
