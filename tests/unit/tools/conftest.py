"""Fixtures shared by the tests of tools/gpu."""

from __future__ import annotations

import pytest
from tiny_bundles import build_tiny


@pytest.fixture(scope="session")
def tiny_bundles(tmp_path_factory) -> dict:
    """The tiny "vllm" and "rest" bundles, built once per session (see tiny_bundles.py)."""
    return build_tiny(tmp_path_factory.mktemp("tiny_bundles"))
