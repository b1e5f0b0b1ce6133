"""``reward_curve.png`` is drawn over the whole run: a resumed run (a restart, or
``trainer.resume``) draws the steps ``metrics.jsonl`` kept from before it too."""

from __future__ import annotations

import json

from fit_stubs import StubRunner, StubSchedule

from rltrain.config.schema import RunConfig
from rltrain.runners import loop


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

    schedule = StubSchedule(lambda step: {"reward/mean": float(step)})
    loop.fit(StubRunner(start=3), schedule, run, str(tmp_path))

    assert drawn == [[(0, 10.0), (1, 11.0), (2, 12.0), (3, 3.0), (4, 4.0)]]
