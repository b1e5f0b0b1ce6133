"""Placement: the grammar, strategies, component placements and the plan. Pure (no Ray, torch).

``rltrain.placement.plan.build_plan`` resolves a run's placement against a ``ClusterSpec``; the
strategies and component placements below are the pieces it uses, usable on their own as in
RLinf.
"""

from rltrain.placement.component import (
    ComponentPlacement,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    PlacementMode,
)
from rltrain.placement.strategies import (
    ExplicitPlacementStrategy,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementStrategy,
)
from rltrain.placement.types import ClusterSpec, NodeGroup, NodeSpec, Placement, parse_ranks

__all__ = [
    "ClusterSpec",
    "ComponentPlacement",
    "ExplicitPlacementStrategy",
    "FlexiblePlacementStrategy",
    "HybridComponentPlacement",
    "ModelParallelComponentPlacement",
    "NodeGroup",
    "NodePlacementStrategy",
    "NodeSpec",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementMode",
    "PlacementStrategy",
    "parse_ranks",
]
