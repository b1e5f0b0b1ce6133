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
