"""Typed errors raised by rltrain.

Every message names the config key (or component), the offending value, and the fix, so a user
can correct the run without reading code.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Iterator
from types import ModuleType


class RltrainError(Exception):
    """Base class of every error rltrain raises on purpose."""


class ConfigError(RltrainError, ValueError):
    """A configuration value is missing, of the wrong type, or inconsistent with another one."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} configuration problems:\n" + "\n".join(
                f"  - {p}" for p in self.problems
            )
        super().__init__(text)


class PlacementError(RltrainError, ValueError):
    """A placement string or layout is invalid for the cluster it is resolved against."""


class ResourceError(RltrainError, RuntimeError):
    """The cluster cannot provide what the plan needs (devices, memory, CPUs)."""


class WorkerError(RltrainError, RuntimeError):
    """A remote worker failed; the message identifies group, rank, node, devices and traceback.

    Attributes:
        cause: the exception the worker raised (None when its process died, or unknown).
        where: ``group 'actor' rank 1 'train'``-style words naming the failed call ("" unknown).
    """

    cause: BaseException | None = None
    where: str = ""


def worker_cause(exc: WorkerError) -> BaseException | None:
    """The exception the worker itself raised: Ray wraps it in a task error whose own
    ``cause`` holds it.

    Args:
        exc: the worker failure.

    Returns:
        The worker's exception, ``exc.cause`` when it is not wrapped, or None when the worker's
        process died (or what it raised is unknown).
    """
    return getattr(exc.cause, "cause", None) or exc.cause


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or while handling (``__cause__``,
    ``__context__``), each once.

    Args:
        exc: where to start (None: nothing).

    Returns:
        An iterator over the exceptions, ``exc`` first.
    """
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack += [e.__cause__, e.__context__]


def import_user_module(key: str, spec: str, module_name: str) -> ModuleType:
    """Import the module of a user's ``module:attribute`` config value (a reward function, an
    environment class).

    Args:
        key: the config key holding ``spec`` (for the message).
        spec: the value as given.
        module_name: its module part.

    Returns:
        The module.

    Raises:
        ImportError: the module is not found (each caller names the fix it needs).
        ConfigError: importing it raised anything else (a syntax error, an exception at import
            time), named with the key.
    """
    try:
        return importlib.import_module(module_name)
    except ImportError:
        raise
    except Exception as exc:  # the user's module is run on import: anything may come out
        # where in the user's module (a SyntaxError's own text names its file and line)
        frames = traceback.extract_tb(exc.__traceback__)
        where = frames and not isinstance(exc, SyntaxError)
        at = f" at {frames[-1].filename}:{frames[-1].lineno}" if where else ""
        raise ConfigError(
            f"{key}={spec!r}: importing module {module_name!r} raised "
            f"{type(exc).__name__}{at}: {exc}; fix the module"
        ) from exc
