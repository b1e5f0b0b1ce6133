"""Explain configuration failures raised while Hydra composes a config."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from rltrain.errors import RltrainError


def _known_keys(object_type: object) -> list[str] | None:
    if isinstance(object_type, type) and dataclasses.is_dataclass(object_type):
        return [f.name for f in dataclasses.fields(object_type)]
    return None


def _schema_field(key: str) -> Any:
    """The schema's field for a full config key (``optimizer.betas``), or None."""
    from rltrain.config.schema import RunConfig

    node: Any = RunConfig
    found = None
    for part in key.split("."):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return None
        hints = typing.get_type_hints(node)
        found = next((f for f in dataclasses.fields(node) if f.name == part), None)
        if found is None:
            return None
        node = hints[part]
        found = (found, node)
        if typing.get_origin(node) is typing.Union:  # Optional[X]
            node = next(a for a in typing.get_args(node) if a is not type(None))
    return found


def _wants(key: str) -> tuple[str, str] | None:
    """What the schema wants at ``key``: words for its type, and an example override."""
    found = _schema_field(key)
    if found is None:
        return None
    field, hint = found
    optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
    if optional:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    default = field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        default = field.default_factory()  # type: ignore[misc]
    origin = typing.get_origin(hint) or hint
    words = {
        int: "a whole number",
        float: "a number",
        bool: "true or false",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(origin, "a value of the schema's type")
    if optional:
        words += " or null"
    if isinstance(default, list):
        example = "[" + ",".join(str(v) for v in default) + "]" if default else "[]"
    elif isinstance(default, bool):
        example = str(default).lower()
    elif default is None or default is dataclasses.MISSING or isinstance(default, dict):
        example = {int: "1", float: "0.5", bool: "true", list: "[]", dict: "{}"}.get(origin, "...")
    else:
        example = str(default)
    return words, f"{key}={example}"


def _given(exc: BaseException, cause: BaseException, key: str) -> str:
    """The value as the command line gave it (an interpolation stays as written)."""
    for line in str(exc).splitlines():
        if line.startswith("Error merging override ") and "=" in line:
            return line[len("Error merging override ") :].split("=", 1)[1]
    value = getattr(cause, "value", None)
    raw = getattr(value, "_value", None)
    value = raw() if callable(raw) else value
    return repr(value) if value is not None else "?"


def _bad_value(exc: BaseException, cause: BaseException) -> str:
    """A value of the wrong type: the key, the value given, what the key takes and an example."""
    key = getattr(cause, "full_key", None) or "?"
    given = _given(exc, cause, key)
    wants = _wants(key)
    if wants is None:
        first = str(cause.msg if hasattr(cause, "msg") else cause).splitlines()[0]
        return f"{key}={given}: {first}; give {key} a value of the schema's type"
    words, example = wants
    note = " (an interpolation whose value is not one)" if given.startswith("${") else ""
    return f"{key}={given} is not {words}{note}: give {key} {words}, e.g. {example}"


def explain(exc: BaseException) -> str | None:
    """Return a one-message explanation of a config failure, or None if it is not one.

    Args:
        exc: the exception raised by composing or checking a config.

    Returns:
        A message naming the key, the value and the fix; None for errors that are not about
        configuration (those keep their traceback).
    """
    from hydra.errors import ConfigCompositionException, MissingConfigException
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        OmegaConfBaseException,
        ValidationError,
    )

    if isinstance(exc, RltrainError):
        return str(exc)
    if isinstance(exc, MissingConfigException):
        text = str(exc).split("\nConfig search path")[0].rstrip()
        return f"{text}\nFix: choose one of the options listed above."
    cause = exc
    if isinstance(exc, ConfigCompositionException) and isinstance(
        exc.__cause__, OmegaConfBaseException
    ):
        cause = exc.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        key = getattr(cause, "full_key", None) or getattr(cause, "key", "?")
        known = _known_keys(getattr(cause, "object_type", None))
        if known is None:  # a free-form mapping: Hydra's own text says to add the key with `+`
            return str(exc).strip()
        return f"unknown config key '{key}': known keys there: {', '.join(known)}."
    if isinstance(cause, ValidationError):
        return _bad_value(exc, cause)
    if isinstance(exc, (ConfigCompositionException, OmegaConfBaseException)):
        text = str(exc).strip()
        why = str(exc.__cause__ or "").split("\n")[0].strip()  # Hydra's text may drop it
        return f"{text}: {why}" if why and why not in text else text
    return None
