"""The layouts the automatic placement considers (:mod:`rltrain.whatif.candidates`, where the
what-if simulator's ranking in ``mode=plan`` reads them too)."""

from __future__ import annotations

from rltrain.whatif.candidates import (
    ON_NODE,
    PLACED,
    SHARED_OFFLOAD,
    Candidate,
    Span,
    apply,
    component_placement,
    embodied_candidates,
    offload_policies,
    reasoning_candidates,
    span_text,
    stage_counts,
)

__all__ = [
    "ON_NODE",
    "PLACED",
    "SHARED_OFFLOAD",
    "Candidate",
    "Span",
    "apply",
    "component_placement",
    "embodied_candidates",
    "offload_policies",
    "reasoning_candidates",
    "span_text",
    "stage_counts",
]
