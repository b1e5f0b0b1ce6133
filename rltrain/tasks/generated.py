"""What the built-in generators (``task.generate``) share: their ``task.params`` read into a
spec, and the lock that lets the jobs of one sweep prepare the same outputs at once.

Pure standard library; no torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from rltrain.errors import ConfigError


def spec_values(cls: Any, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The fields of the spec dataclass ``cls`` that ``task.params`` sets, type-checked.

    Other keys of ``task.params`` are not the generator's and are left alone; ``seed`` comes
    from the run, not from ``task.params``.

    Args:
        cls: the generator's spec dataclass (int and float fields).
        params: ``task.params``.
        seed: the run's seed.

    Returns:
        Keyword arguments for ``cls``.

    Raises:
        ConfigError: a value of the wrong type (a bool, a string, a non-finite float), naming
            ``task.params.<name>``.
    """
    values: dict[str, Any] = {"seed": seed}
    problems = []
    for f in fields(cls):
        if f.name == "seed" or f.name not in params:
            continue
        v = params[f.name]
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
