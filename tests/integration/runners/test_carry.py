"""``trainer.partial_rollout=carry`` for real on Ray and the torch engine: rows unfinished when a
call has its groups are carried into the next call (decoded in segments, continued under the
newer weights), a batch's staleness counts from the oldest version that sampled any of its
tokens, and the groups still buffered at the end count as discarded."""

from __future__ import annotations

from rltrain.runners.reasoning import run_reasoning
from rltrain.telemetry.metrics import read_metrics

from .test_reasoning import compose_run


def test_carry_hands_on_carried_groups_within_the_bound(ray_session, tmp_path):
    ray_session.ensure()
    run = compose_run(
        "algorithm.entropy_coef=0.01",
        "placement=disaggregated",
        "trainer.eval_every=0",
        "trainer.train_batch_size=4",
        "logging.progress=false",
        "trainer.total_steps=4",
        "trainer.max_staleness=2",
        "trainer.partial_rollout=carry",
        "rollout.max_new_tokens=8",
        "trainer.carry_segment=2",
        "simulate.actor_latency_ms=100",
    )
    summary = run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 4
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    stale = [r["rollout/staleness_max"] for r in records]
    # step 0 trains the primed groups (version 0); later calls are sent one step ahead, so their
    # own groups are 1 version stale and a group carried through a whole call is 2
    assert stale[0] == 0 and all(1 <= s <= 2 for s in stale[1:]), stale
    assert 2 in stale, stale  # a group carried through a whole call
    for step, r in enumerate(records):
        assert r["rollout/weight_version"] == r["rollout/oldest_version"] == step - stale[step]
    # the truncated importance weights see each token's own behaviour log-probs
    assert all(0.0 < r["actor/tis_weight_mean"] <= run.algorithm.tis_cap for r in records)
    totals = summary["rollout"]
    assert totals["within_bound"] == 1.0 and totals["staleness_max"] == 2
    # the groups still buffered after the last step never train: counted, tokens discarded
    assert records[-1]["rollout/unfinished_groups"] == totals["unfinished_groups"] >= 1
    assert totals["discarded_tokens"] == sum(r["rollout/discarded_tokens"] for r in records)
    assert records[-1]["rollout/discarded_tokens"] >= 1
