"""Fixtures of the launcher tests: the session's Ray (tests/integration/conftest.py), by address.

Every sweep here joins that one Ray (``ray_address``) instead of starting its own: in-process
sweeps find it already connected, subprocess sweeps get ``hydra.launcher.ray.init.address``.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def join_flag(ray_address: str) -> str:
    return f"hydra.launcher.ray.init.address={ray_address}"
