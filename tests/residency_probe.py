"""Reads a reasoning run's residency counts from a test: what each component moved off and
back onto its devices, counted by the job's residency coordinator while the run lasts."""

from __future__ import annotations

from typing import Any

import pytest


def record_residency_counts(patch: pytest.MonkeyPatch) -> dict[Any, int]:
    """Make ``ReasoningRunner.fit`` (within ``patch``) leave the job's residency counts in the
    dict returned, ``(component, event) -> times``, once the run's training ends."""
    from rltrain.runners import reasoning

    counts: dict[Any, int] = {}
    real_fit = reasoning.ReasoningRunner.fit

    def fit(self):
        result = real_fit(self)
        counts.update(self.job.residency.counts())
        return result

    patch.setattr(reasoning.ReasoningRunner, "fit", fit)
    return counts
