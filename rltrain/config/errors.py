"""Explain configuration failures raised while Hydra composes a config."""

from __future__ import annotations

import dataclasses

from rltrain.errors import RltrainError


def _known_keys(object_type: object) -> list[str] | None:
    if isinstance(object_type, type) and dataclasses.is_dataclass(object_type):
        return [f.name for f in dataclasses.fields(object_type)]
    return None


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
        key = getattr(cause, "full_key", None) or "?"
        first = str(cause.msg if hasattr(cause, "msg") else cause).splitlines()[0]
        return f"bad value for '{key}': {first}. Fix: give {key} a value of the schema's type."
    if isinstance(exc, (ConfigCompositionException, OmegaConfBaseException)):
        return str(exc)
    return None
