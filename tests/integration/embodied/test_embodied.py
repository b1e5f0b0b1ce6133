"""The embodied trainer, for real, on the session's local Ray (simulated devices): a few
iterations per placement mode, pipelined overlap read from the timeline, offloads by policy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from composed import composed_run as compose_run

from rltrain.runners.embodied import pipeline_overlap, run_embodied
from rltrain.telemetry.metrics import read_metrics

pytestmark = pytest.mark.spread  # no module fixture: each test may run in either process

SHORT = (
    "trainer.total_steps=2",
    "trainer.eval_every=2",
    "env.eval_episodes=4",
    "env.num_envs=4",
    "env.rollout_steps=8",
    "env.target_return=null",
    "logging.progress=false",
)
#: Modelled device time: 2 environments per stage x 40 ms, for env steps and inference alike
#: (well above the ~40 ms channel round trip of a loaded 2-core machine).
LATENCY = ("simulate.env_step_latency_ms=40", "simulate.env_policy_latency_ms=40")


#: The ``section/name`` metrics docs/embodied.md spells out (its metrics table).
DOCUMENTED = set(
    re.findall(
        r"`([a-z]+/[a-z_0-9]+)`",
        (Path(__file__).resolve().parents[3] / "docs" / "embodied.md").read_text(),
    )
)


def check_run(summary, tmp_path, mode: str) -> dict:
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["placement_mode"] == mode
    assert summary["env_steps_per_s"] > 0 and summary["final_return"] >= 8  # CartPole: >= 8 steps
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["env/episodes"] >= 0 and r["loss/value"] > 0 for r in records)
    # an update in which no episode ended has no mean return: absent, not null
    assert all(("env/return_mean" in r) == (r["env/episodes"] > 0) for r in records)
    assert all(v is not None for r in records for v in r.values())
    assert records[-1]["eval/return_mean"] == summary["final_return"]
    logged = {k for r in records for k in r} - {"step"}
    assert not logged - DOCUMENTED, f"not in docs/embodied.md: {sorted(logged - DOCUMENTED)}"
    cap = 4 * 1024**3
    assert all(0 < b <= cap for b in summary["peak_memory_bytes_per_device"].values())
    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    assert (tmp_path / "checkpoints" / latest / "policy.pt").is_file()
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {"env_step", "generate", "train"} <= {e.get("name") for e in trace["traceEvents"]}
    return trace


@pytest.mark.timeout(300)
def test_hybrid_pipelines_env_and_rollout_and_offloads_the_rollout_for_training(
    ray_session, tmp_path, monkeypatch
):
    """The seeds' hybrid layout: env on device 0, rollout on device 1, actor on both."""
    from rltrain.runners import embodied

    ray_session.ensure()
    counts: dict = {}
    real_fit = embodied.EmbodiedRunner.fit

    def fit(self):
        out = real_fit(self)
        counts.update(self.job.residency.counts())
        return out

    monkeypatch.setattr(embodied.EmbodiedRunner, "fit", fit)
    run = compose_run("experiment=cartpole_hybrid", *SHORT, *LATENCY)
    trace = check_run(run_embodied(run, str(tmp_path)), tmp_path, "hybrid")
    overlap = pipeline_overlap(trace)
    # 2 stages: env steps stage s+1 while the rollout infers stage s (the sequential layout
    # below never overlaps them)
    assert overlap.env_busy_s > 0 and overlap.rollout_busy_s > 0
    assert overlap.both_s > 0, overlap
    # rollout leaves its device after each epoch and evaluation (after_stage), plus start-up
    assert counts[("rollout", "offload")] == 2 + 1 + 1
    assert counts[("rollout", "reload")] == 2 + 1


@pytest.mark.timeout(300)
def test_collocated_with_one_stage_is_strictly_sequential(ray_session, tmp_path):
    """One stage per env process: env and rollout take turns, the timeline shows no overlap."""
    ray_session.ensure()
    run = compose_run(
        "experiment=cartpole_collocated", "env.pipeline_stage_num=1", *SHORT, *LATENCY
    )
    trace = check_run(run_embodied(run, str(tmp_path)), tmp_path, "collocated")
    overlap = pipeline_overlap(trace)
    assert overlap.env_busy_s > 0 and overlap.both_s == 0.0, overlap


@pytest.mark.timeout(300)
def test_disaggregated_runs_and_resumes_from_its_checkpoint(ray_session, tmp_path):
    ray_session.ensure()
    run = compose_run("experiment=cartpole_disaggregated", *SHORT)
    check_run(run_embodied(run, str(tmp_path)), tmp_path, "disaggregated")
    resumed = compose_run(
        "experiment=cartpole_disaggregated",
        *SHORT,
        "trainer.total_steps=3",
        "trainer.resume=auto",
        f"trainer.checkpoint_dir={tmp_path / 'checkpoints'}",
    )
    out = tmp_path / "resumed"
    summary = run_embodied(resumed, str(out))
    assert summary["steps"] == 1  # steps 0 and 1 came from the checkpoint
    assert [r["step"] for r in read_metrics(str(out / "metrics.jsonl"))] == [2]


@pytest.mark.timeout(300)
def test_a_time_budget_stop_evaluates_the_update_it_stops_at(ray_session, tmp_path):
    """The budget is spent in the first update, which no evaluation is due after: it is
    evaluated as the last update would be, so ``final_return`` is that evaluation's."""
    ray_session.ensure()
    run = compose_run(
        "experiment=cartpole_hybrid", *SHORT, "trainer.total_steps=4", "trainer.time_budget_s=0.1"
    )
    summary = run_embodied(run, str(tmp_path))
    assert (summary["status"], summary["steps"]) == ("completed", 1)
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0]
    assert summary["final_return"] == records[0]["eval/return_mean"] >= 8  # CartPole: >= 8 steps
    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    assert (tmp_path / "checkpoints" / latest / "policy.pt").is_file()
