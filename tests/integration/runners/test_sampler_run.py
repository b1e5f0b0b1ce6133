"""``trainer.sampler=windowed`` and ``rollout.dispatch=length_aware`` on one real run: the
pooled schedule is the one that trains, and the dispatch learns from the real shards' scores."""

from __future__ import annotations

import pytest

from rltrain.runners.reasoning import run_reasoning
from rltrain.telemetry.metrics import read_metrics

from .test_async import SHORT, _spans
from .test_reasoning import compose_run


@pytest.mark.timeout(300)
def test_a_window_of_one_version_trains_only_fresh_batches_dispatched_by_length(
    ray_session, tmp_path
):
    ray_session.ensure()
    run = compose_run(
        *SHORT,
        "trainer.total_steps=2",
        "trainer.max_staleness=1",
        "trainer.sampler=windowed",
        "trainer.sampler_window=1",
        "rollout.dispatch=length_aware",
    )
    summary = run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 2
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    # in_order with k=1 trains [0, 1] versions stale (test_async); a window of one
    # version trains only batches sampled with the actor's own weights
    assert [r["rollout/staleness_max"] for r in records] == [0, 0]
    assert [r["rollout/weight_version"] for r in records] == [0, 1]
    # step 0's fill sent two generations with version 0; step 0 trained the first, the
    # second is one version old at step 1: dropped, all of its samples
    per_step = run.trainer.train_batch_size * run.rollout.n_samples_per_prompt
    dropped = [r["rollout/dropped_samples"] for r in records]
    assert dropped == [0, per_step]
    assert summary["rollout"]["dropped_samples"] == sum(dropped)
    assert all("rollout/pooled_samples" in r for r in records)
    # the dropped generation really ran on the rollout, besides the two trained
    assert len(_spans(tmp_path, "generate", "rollout")) == 3
    # the dispatcher found the prompts of every trained shard by its object ref: each step
    # folds in one length per prompt group
    assert [r["rollout/length_groups"] for r in records] == [run.trainer.train_batch_size] * 2
