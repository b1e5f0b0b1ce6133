"""The list of cross-field checks every ``load_config`` runs (:mod:`rltrain.config.validate`).

A module of checks registers each with :func:`check`; validate imports those modules, so a
check module never imports validate back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from rltrain.config.schema import RunConfig

Check = Callable[[RunConfig], Iterator[str]]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    """Register a cross-field check: a generator of problem messages (empty when fine)."""
    CHECKS.append(fn)
    return fn
