"""Node ranks as written in config (``"0-3"``, ``"2,3"``, ``[2, 3]``): read by the config checks
and by the placement layer's node groups. Pure; no torch, no Ray."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rltrain.errors import ConfigError


def parse_ranks(value: Any, key: str) -> tuple[int, ...]:
    """Parse node ranks given as ``"0-3"``, ``"2,3"``, ``"0-1,4"``, an int or a list of ints.

    Args:
        value: the ranks as written in config.
        key: the config key, for error messages.

    Returns:
        The ranks in the order written.

    Raises:
        ConfigError: when the value is not one of the shapes above.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not a rank list: write '0-3', '2,3' or [2, 3]")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, Sequence) and not isinstance(value, str):
        out: list[int] = []
        for v in value:
            out.extend(parse_ranks(v, key))
        return tuple(out)
    text = str(value).replace(" ", "")
    out = []
    try:
        for part in text.split(","):
            if "-" in part:
                a, b = part.split("-")
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise ConfigError(
            f"{key}={value!r} is not a rank list: write '0-3', '2,3' or [2, 3]"
        ) from None
    return tuple(out)
