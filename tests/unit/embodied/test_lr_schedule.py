"""``env.lr_final_fraction``'s schedule as docs/embodied.md states it, by hand: update ``i`` of
``T`` trains at ``lr x (1 - (1 - f) x i / T)``, so the last one at ``lr x (f + (1 - f) / T)``,
never at ``f x lr``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rltrain.config.schema import RunConfig
from rltrain.workers.embodied import EmbodiedActorWorker


def test_the_last_update_trains_one_step_short_of_the_final_fraction():
    run = RunConfig()
    run.optimizer.lr, run.optimizer.warmup_steps = 1.0, 0
    run.env.lr_final_fraction, run.trainer.total_steps = 0.2, 4
    worker = SimpleNamespace(run=run)
    # T=4, f=0.2: 1 - 0.8 x i / 4 for i = 0..3
    lrs = [EmbodiedActorWorker.lr_at(worker, i, 100) for i in range(4)]
    assert lrs == pytest.approx([1.0, 0.8, 0.6, 0.4])
    assert lrs[-1] == pytest.approx(0.2 + 0.8 / 4)  # f + (1 - f) / T, not f
