"""``reward_curve.png`` is drawn over the whole run: a resumed run (a restart, or
``trainer.resume``) draws the steps ``metrics.jsonl`` kept from before it too."""

from __future__ import annotations

import json
from typing import Any

from rltrain.config.schema import RunConfig
from rltrain.runners import loop


class _Schedule:
    queues_ahead = False

    def begin(self, start: int, horizon: int) -> None:
        pass

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        return {"reward/mean": float(step)}

    def has_queued(self) -> bool:
        return False

    def evaluate(self, step: int) -> dict[str, Any]:
        return {}

    def end(self, done_steps: int, clean: bool) -> None:
        pass


class _Resumed:
    """Resumes from the step-3 checkpoint."""

    def resume(self) -> int:
        return 3

    def save(self, step: int) -> str:
        return f"step-{step}"

    def evaluation_due(self, step: int, record: dict[str, Any]) -> bool:
        return False

    def target_reached(self, evaluated: dict[str, Any] | None) -> bool:
        return False

    def summary(self, records: list[dict], steps: int, seconds: float, status: str) -> dict:
        return {"steps": steps, "status": status}


def test_a_resumed_run_draws_the_steps_kept_from_before_it(tmp_path, monkeypatch):
    # The earlier attempt logged steps 0-3 and failed in step 4; the checkpoint is step 3's,
    # so its step-3 record is dropped and logged again.
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for step in range(4):
            f.write(json.dumps({"step": step, "reward/mean": 10.0 + step}) + "\n")
    drawn: list[list[tuple[int, float]]] = []
    monkeypatch.setattr(
        loop,
        "plot_curves",
        lambda records, path: drawn.append([(r["step"], r["reward/mean"]) for r in records]),
    )
    run = RunConfig()
    run.trainer.total_steps, run.trainer.eval_every = 5, 0
    run.logging.progress = False

    loop.fit(_Resumed(), _Schedule(), run, str(tmp_path))

    assert drawn == [[(0, 10.0), (1, 11.0), (2, 12.0), (3, 3.0), (4, 4.0)]]
