"""The layouts the automatic placement considers (:mod:`rltrain.whatif.candidates`, where the
what-if simulator's ranking in ``mode=plan`` reads them too)."""

from __future__ import annotations

from rltrain.whatif.candidates import (
    DEFAULT_PARTIAL_ROLLOUTS,
    ON_NODE,
    PARTIAL_ROLLOUTS,
    PLACED,
    SHARED_OFFLOAD,
    Candidate,
    Span,
    apply,
    as_set_by_hand,
    component_placement,
    embodied_candidates,
    offload_policies,
    partial_rollout_policies,
    reasoning_candidates,
    span_text,
    stage_counts,
)

__all__ = [
    "DEFAULT_PARTIAL_ROLLOUTS",
    "ON_NODE",
    "PARTIAL_ROLLOUTS",
    "PLACED",
    "SHARED_OFFLOAD",
    "Candidate",
    "as_set_by_hand",
    "Span",
    "apply",
    "component_placement",
    "embodied_candidates",
    "offload_policies",
    "partial_rollout_policies",
    "reasoning_candidates",
    "span_text",
    "stage_counts",
]
