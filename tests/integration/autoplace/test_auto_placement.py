"""placement=auto end to end on the local Ray with simulated devices: profile, choose, train.

Generation takes >= 1.5 s per step and the update >= 0.5 s (latency knobs; the compute of the
tiny batch is a few ms), so on two devices the asynchronous split (rollout on one device, actor
on the other, max_staleness=1: about max(1.5, 0.5 + overheads) per step) beats every synchronous
layout (at least 1.5 + 0.5). The overheads grow with the machine's load and show in the
measured costs, so the test holds the order of the predictions, never a margin between them.
"""

from __future__ import annotations

import json

import pytest

from rltrain.autoplace import AutoSettings, choose
from rltrain.autoplace.readings import read_metrics
from rltrain.bench.measures.trainer import compose
from rltrain.runners.reasoning import run_reasoning

KNOBS = (
    "placement=auto",
    "simulate.rollout_latency_ms=1500",
    "simulate.actor_latency_ms=500",
    "trainer.train_batch_size=2",
    "rollout.n_samples_per_prompt=2",
    "rollout.max_new_tokens=1",
    "trainer.total_steps=2",  # the winner's run: one step overlapping the next's generation
    "trainer.eval_every=0",
    "logging.progress=false",
)


@pytest.mark.slow
def test_auto_profiles_chooses_and_trains_the_winner(ray_session, tmp_path):
    ray_session.ensure()  # profiling and the run share the session's Ray (2 simulated devices)
    run = compose(*KNOBS)
    settings = AutoSettings(cache_dir=str(tmp_path / "cache"), profile_steps=3)

    choice = choose(run, str(tmp_path / "first"), settings)

    # Profiled for real: both devices fused, then the balanced split.
    p = choice.profile
    assert p.source == "measured" and [r["layout"] for r in p.runs] == [
        "collocated 0-1 fused",
        "disaggregated actor 0 rollout 1",
    ]
    assert p.costs.generate.at(1) >= 1.5 and p.costs.train.at(1) >= 0.5  # the knobs' sleeps
    split = tmp_path / "first" / "auto_profile" / "disaggregated_actor_0_rollout_1"
    assert (split / "trace.json").exists()
    # Every candidate was checked and ranked; the asynchronous split wins.
    assert len(choice.ranking) == 6 and all(r["status"] == "ok" for r in choice.ranking)
    assert choice.winner.candidate.name == "disaggregated actor 0 rollout 1 async1"
    fused = next(r for r in choice.ranking if r["candidate"] == "collocated 0-1 fused")
    # The fused layout pays both sleeps in turn; the split overlaps them.
    assert fused["predicted_s_per_step"] >= 1.5 + 0.5
    assert fused["predicted_s_per_step"] > choice.winner.seconds
    doc = json.loads((tmp_path / "first" / "auto_placement.json").read_text())
    assert doc["winner"] == choice.winner.candidate.name

    # The winner trains as any run: asynchronous, on separate devices.
    out = tmp_path / "winner"
    summary = run_reasoning(choice.run, str(out))
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["placement_mode"] == "disaggregated"
    records = read_metrics(str(out))
    assert all("rollout/staleness" in r for r in records)

    # A second run reads the cached profile: no profiling run starts.
    again = choose(run, str(tmp_path / "second"), settings)
    assert again.profile.source == "cache" and again.profile.path == p.path
    assert again.winner.candidate == choice.winner.candidate
    assert not (tmp_path / "second" / "auto_profile").exists()
