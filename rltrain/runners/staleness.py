"""Per-sample staleness accounting for the pipelined schedule (pure logic, no Ray).

A sample's staleness is the number of weight versions between the version that sampled its
first token and the update that trains on it: a batch trained at step ``s`` (which the actor's
version ``s`` trains, exporting ``s + 1``) with first version ``v`` is ``s - v`` versions stale.
A partial rollout that continues (``trainer.partial_rollout=continue``) samples later tokens with
newer weights, but its staleness still counts from the first: that is the version whose
behaviour started the response.

The bound: no sample trains more than ``trainer.max_staleness`` versions after the version that
started it. The pipeline submits step ``t``'s generation no earlier than step ``t - k`` (so with
version ``>= t - k``) and keeps a continued generation's first version, so the bound holds by
construction; :func:`over_bound` is the check the pipeline applies before training anyway, and a
batch past it is dropped (``rollout/dropped_samples``) and generated again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Step-record keys summed over the run into ``summary.json``'s ``rollout`` totals.
SUMMED = ("rollout/dropped_samples", "rollout/discarded_tokens", "rollout/continued_tokens")

#: ``carry``: the last step's record counts the groups its rollout still held (never trained).
UNFINISHED = "rollout/unfinished_groups"


def staleness(step: int, first_version: int) -> int:
    """Versions between a batch's first sampling version and the step that trains it.

    Args:
        step: the training step (the actor holds version ``step``).
        first_version: the version its first tokens were sampled with.

    Returns:
        ``step - first_version`` (0 for a batch sampled with the actor's own weights).
    """
    return step - first_version


def over_bound(step: int, first_version: int, max_staleness: int) -> bool:
    """Whether a batch would train more than ``max_staleness`` versions after it started.

    Args:
        step: the training step.
        first_version: the version its first tokens were sampled with.
        max_staleness: ``trainer.max_staleness``.
    """
    return staleness(step, first_version) > max_staleness


def run_totals(
    records: Iterable[Mapping[str, Any]],
    max_staleness: int,
    left: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """``summary.json``'s ``rollout`` totals over the run's step records.

    Every step trains the same number of samples, so shares over steps are shares of samples.

    Args:
        records: the step records (``metrics.jsonl``).
        max_staleness: ``trainer.max_staleness``.
        left: ``carry``: the ``groups`` still buffered when the run stopped after its last
            record (an early stop) and their ``tokens``, counted as discarded.

    Returns:
        ``staleness_max`` (the largest ``rollout/staleness_max`` of any step), the run totals of
        the :data:`SUMMED` keys (``dropped_samples``, ``discarded_tokens``, ``continued_tokens``),
        with ``carry`` ``unfinished_groups`` (groups buffered at the run's end, never trained;
        their tokens are in ``discarded_tokens``), and ``within_bound``, the share of trained
        samples at most ``max_staleness`` versions stale; empty when no step reported
        staleness (a synchronous run).
    """
    steps = [r for r in records if "rollout/staleness_max" in r]
    if not steps:
        return {}
    out: dict[str, Any] = {"staleness_max": max(r["rollout/staleness_max"] for r in steps)}
    for key in SUMMED:
        out[key.split("/", 1)[1]] = sum(int(r.get(key) or 0) for r in steps)
    if left or any(UNFINISHED in r for r in steps):
        out["unfinished_groups"] = sum(int(r.get(UNFINISHED) or 0) for r in steps)
        out["unfinished_groups"] += (left or {}).get("groups", 0)
        out["discarded_tokens"] += (left or {}).get("tokens", 0)
    within = sum(r["rollout/staleness_max"] <= max_staleness for r in steps)
    out["within_bound"] = within / len(steps)
    return out
