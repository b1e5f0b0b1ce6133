"""A fused rank's evaluations each draw their own seed (as a rollout's follow its weight
version): ``simulate.tool_failure_rate`` then fails other episodes at each evaluation."""

from __future__ import annotations

from types import SimpleNamespace

from rltrain.config import seeds
from rltrain.config.schema import RunConfig
from rltrain.workers.fused import FusedWorker


def test_each_evaluation_of_a_fused_rank_has_the_seed_of_its_update_count():
    got: list[int] = []
    worker = FusedWorker.__new__(FusedWorker)  # the method's own state only: no model built
    worker.run, worker.updates = RunConfig(), 0
    worker._rltrain_ctx = SimpleNamespace(device_labels=("cpu",))
    worker.rule = SimpleNamespace(task="the task")
    worker.interaction = SimpleNamespace(evaluate=lambda task, seed: got.append(seed) or 0.5)
    assert worker.evaluate() == 0.5
    worker.updates = 3
    worker.evaluate()
    run_seed = worker.run.seed
    assert got == [seeds.eval_episode_seed(run_seed, 0, 0), seeds.eval_episode_seed(run_seed, 3, 0)]
    assert got[0] != got[1]
