"""Asynchronous rollout with bounded staleness (``trainer.max_staleness``), for real on Ray."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from rltrain.errors import ConfigError
from rltrain.runners.reasoning import run_reasoning
from rltrain.telemetry.metrics import read_metrics

from .test_reasoning import compose_run

# Generation and training each take >= 300 ms, so an overlap is a property of the schedule.
# The untrained policy rarely earns a reward; the entropy bonus moves the weights every step, so a
# stale batch's behaviour policy really differs from the actor's.
SHORT = (
    "algorithm.entropy_coef=0.01",
    "placement=disaggregated",
    "trainer.eval_every=0",
    "trainer.train_batch_size=4",
    "logging.progress=false",
    "simulate.rollout_latency_ms=300",
    "simulate.actor_latency_ms=300",
)


# ------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("placement", ["collocated", "hybrid"])
def test_staleness_is_refused_where_rollout_and_actor_share_a_device(placement, tmp_path):
    run = compose_run(f"placement={placement}", "trainer.max_staleness=1")
    with pytest.raises(ConfigError, match=f"trainer.max_staleness=1.*mode {placement}"):
        run_reasoning(run, str(tmp_path))  # refused by the plan check, before Ray starts


def test_unknown_partial_rollout_is_refused_when_the_config_loads():
    with pytest.raises(ConfigError, match=r"trainer.partial_rollout='always'.*'finish'.*'restart'"):
        compose_run("placement=disaggregated", "trainer.partial_rollout=always")


# ------------------------------------------------------------------------------ real runs
def _spans(run_dir: pathlib.Path, name: str, component: str) -> list[tuple[float, float]]:
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    # a span is drawn on its device lanes and its process lane: one interval each, deduplicated
    return sorted(
        {
            (e["ts"], e["ts"] + e["dur"])
            for e in events
            if e.get("ph") == "X" and e.get("name") == name and e.get("cat") == component
        }
    )


@pytest.fixture(scope="module")
def sync_run(ray_session, tmp_path_factory) -> list[dict[str, Any]]:
    ray_session.ensure()
    out = tmp_path_factory.mktemp("sync")
    run_reasoning(compose_run(*SHORT, "trainer.total_steps=2"), str(out))
    return read_metrics(str(out / "metrics.jsonl"))


@pytest.mark.timeout(300)
def test_max_staleness_zero_is_the_on_policy_synchronous_loop(sync_run):
    assert [r["step"] for r in sync_run] == [0, 1]
    assert not any(k in r for r in sync_run for k in ("rollout/staleness", "rollout/restarts"))
    # pi_old is the actor's own: the ratio is exactly 1, so nothing is clipped and the KL is 0
    assert all(r["actor/approx_kl"] == 0.0 and r["actor/clip_frac"] == 0.0 for r in sync_run)


@pytest.mark.timeout(300)
def test_the_rollout_and_the_trainer_agree_on_the_log_probs_every_step(sync_run):
    # the parity check, on by default: the torch rollout's log-probs (KV-cached decoding) and
    # the actor's forward pass, same weights, same float32: equal up to rounding
    for r in sync_run:
        assert r["rollout/logprob_gap_tokens"] > 0
        assert 0.0 <= r["rollout/logprob_gap_mean"] <= r["rollout/logprob_gap_max"] <= 1e-5
        assert r["actor/tis_weight_mean"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.timeout(300)
def test_disaggregated_max_staleness_one_overlaps_and_bounds_staleness(
    sync_run, ray_session, tmp_path
):
    ray_session.ensure()
    run = compose_run(*SHORT, "trainer.total_steps=4", "trainer.max_staleness=1")
    summary = run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 4
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    staleness = [r["rollout/staleness"] for r in records]
    assert staleness == [0, 1, 1, 1] and max(staleness) <= run.trainer.max_staleness
    assert [r["step"] - r["rollout/weight_version"] for r in records] == staleness
    # step 0 samples with version 0 in both schedules: the same responses, the same rewards
    assert records[0]["reward/mean"] == sync_run[0]["reward/mean"]
    assert records[0]["response/length_mean"] == sync_run[0]["response/length_mean"]
    # stale batches (auto recomputes pi_old): the clipped ratio is taken against the actor's
    # own log-probs, and each token is weighed by min(pi_old / pi_rollout, tis_cap) instead,
    # pi_rollout being the older weights' (the gap measures how far they moved)
    assert all(r["actor/approx_kl"] == 0.0 for r in records)
    assert records[0]["rollout/logprob_gap_max"] <= 1e-5  # step 0: the same weights
    for r in records[1:]:
        assert r["rollout/logprob_gap_mean"] > 1e-4
        assert r["actor/tis_weight_mean"] != pytest.approx(1.0, abs=1e-5)
    # the rollout generated step t + 1 while the actor trained step t
    gens = _spans(tmp_path, "generate", "rollout")
    trains = _spans(tmp_path, "train", "actor")
    assert len(gens) == 4 and len(trains) == 4
    overlaps = [
        min(g_end, t_end) - max(g_start, t_start)
        for (g_start, g_end), (t_start, t_end) in zip(gens[1:], trains[:-1], strict=True)
    ]
    assert all(o > 0 for o in overlaps), overlaps


@pytest.mark.spread  # uses no module fixture
@pytest.mark.timeout(300)
def test_restart_discards_generations_running_at_a_weight_swap(ray_session, tmp_path):
    ray_session.ensure()
    # generation far slower than training: the next step's generation is still running when
    # the actor publishes, so it is cancelled and run again with the new weights
    latency_ms = 1500
    shared = [o for o in SHORT if "latency_ms" not in o]
    run = compose_run(
        *shared,
        "trainer.total_steps=3",
        "trainer.max_staleness=1",
        "trainer.partial_rollout=restart",
        f"simulate.rollout_latency_ms={latency_ms}",
    )
    summary = run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 3
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    restarts = [r["rollout/restarts"] for r in records]
    staleness = [r["rollout/staleness"] for r in records]
    assert restarts[0] == 0 and sum(restarts) >= 1, restarts
    # a restarted batch carries the newest weights; one that finished in time is 1 behind
    assert staleness == [0] + [0 if n else 1 for n in restarts[1:]], (staleness, restarts)
    # every submission ran on the rollout, and a cancelled one threw away what it had sampled
    gens = _spans(tmp_path, "generate", "rollout")
    assert len(gens) == 3 + sum(restarts)
    discarded = [r["rollout/discarded_tokens"] for r in records]
    assert discarded[0] == 0 and sum(discarded) > 0, (discarded, restarts)


@pytest.mark.spread  # uses no module fixture
@pytest.mark.timeout(300)
def test_continue_keeps_the_tokens_of_generations_running_at_a_weight_swap(ray_session, tmp_path):
    ray_session.ensure()
    # decoding far slower than training (a modelled device, per token): the next step's
    # generation is mid-response at every swap, so it pauses and goes on with the new weights
    shared = [o for o in SHORT if "latency_ms" not in o]
    run = compose_run(
        *shared,
        "trainer.total_steps=3",
        "trainer.max_staleness=1",
        "trainer.partial_rollout=continue",
        "rollout.max_new_tokens=8",
        "simulate.actor_latency_ms=900",  # the swap lands a few tokens into the next response
        "simulate.rollout_token_latency_ms=300",
    )
    summary = run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 3
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    continued = [r["rollout/continued"] for r in records]
    assert continued[0] == 0 and sum(continued) >= 1, continued
    # staleness counts from the version that started a batch, continued or not: within k
    assert [r["rollout/staleness"] for r in records] == [0, 1, 1]
    assert all(r["rollout/staleness_max"] <= 1 for r in records)
    for r, n in zip(records[1:], continued[1:], strict=True):
        assert r["rollout/newest_version"] == r["rollout/weight_version"] + (1 if n else 0)
    # a continued batch holds tokens of both versions; nothing sampled was thrown away
    assert sum(r["rollout/continued_tokens"] for r in records) >= 1
    assert all(r["rollout/discarded_tokens"] == 0 for r in records)
    # the truncated importance weights see the newer tokens' own behaviour log-probs
    assert all(0.0 < r["actor/tis_weight_mean"] <= run.algorithm.tis_cap for r in records)
    totals = summary["rollout"]
    assert totals["within_bound"] == 1.0 and totals["discarded_tokens"] == 0
    assert totals["continued_tokens"] == sum(r["rollout/continued_tokens"] for r in records)
    # every pass ran on the rollout: the first ones and each continuation
    assert len(_spans(tmp_path, "generate", "rollout")) == 3 + sum(continued)


@pytest.mark.spread  # uses no module fixture
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_continue_learns_the_default_task(ray_session, tmp_path):
    ray_session.ensure()
    # decoding slower than an update, so most steps continue a generation across a swap; the
    # untrained policy is near 0 and the default task passes 0.5 greedy in ~150 steps (seed 1)
    run = compose_run(
        "placement=disaggregated",
        "logging.progress=false",
        "seed=1",
        "trainer.max_staleness=1",
        "trainer.partial_rollout=continue",
        "trainer.total_steps=200",
        "trainer.eval_every=25",
        "trainer.target_accuracy=0.5",
        "simulate.rollout_token_latency_ms=60",
        "simulate.actor_latency_ms=120",
    )
    summary = run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed"
    assert summary["final_accuracy"] >= 0.5, summary
    totals = summary["rollout"]
    assert totals["continued_tokens"] > 0 and totals["discarded_tokens"] == 0
    assert totals["within_bound"] == 1.0 and totals["staleness_max"] == 1
