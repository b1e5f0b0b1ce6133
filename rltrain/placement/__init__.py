"""Placement: the grammar, strategies, component placements and the plan. Pure (no Ray, torch)."""

from rltrain.placement.types import ClusterSpec, NodeGroup, NodeSpec, Placement, parse_ranks

__all__ = ["ClusterSpec", "NodeGroup", "NodeSpec", "Placement", "parse_ranks"]
