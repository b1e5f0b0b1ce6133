"""Stand-ins for what ``rltrain.runners.loop.fit`` drives: a schedule whose steps each log one
record and a runner that saves nothing — a fit of a few steps with no Ray and no model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StubSchedule:
    """Step ``s`` logs ``record(s)``; an evaluation logs ``{"eval/accuracy": 0.25}``.

    Args:
        record: the step's record (default: ``reward/mean`` 0.5 + step).
        clock: a stand-in for ``time`` (its ``now`` in seconds), advanced 1 s per step.
    """

    queues_ahead = False

    def __init__(
        self, record: Callable[[int], dict[str, Any]] | None = None, clock: Any = None
    ) -> None:
        self.record = record or (lambda step: {"reward/mean": 0.5 + step})
        self.clock = clock

    def begin(self, start: int, horizon: int) -> None:
        pass

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        if self.clock is not None:
            self.clock.now += 1.0
        return self.record(step)

    def has_queued(self) -> bool:
        return False

    def evaluate(self, step: int) -> dict[str, Any]:
        return {"eval/accuracy": 0.25}

    def end(self, done_steps: int, clean: bool) -> None:
        pass


class StubRunner:
    """Resumes at step ``start`` (0: a fresh run); its summary holds the steps, the seconds and
    the status ``fit`` hands it."""

    def __init__(self, start: int = 0) -> None:
        self.start = start

    def resume(self) -> int:
        return self.start

    def save(self, step: int) -> str:
        return f"step-{step}"

    def evaluation_due(self, step: int, record: dict[str, Any]) -> bool:
        return False

    def target_reached(self, evaluated: dict[str, Any] | None) -> bool:
        return False

    def summary(self, records: list[dict], steps: int, seconds: float, status: str) -> dict:
        return {"steps": steps, "seconds": seconds, "status": status}
