"""Fixtures of the placement tests."""

from __future__ import annotations

import pytest
from placement_helpers import make_cluster

from rltrain.placement.types import ClusterSpec


@pytest.fixture
def node8() -> ClusterSpec:
    return make_cluster(8)


@pytest.fixture
def two_nodes() -> ClusterSpec:
    return make_cluster(8, num_nodes=2)
