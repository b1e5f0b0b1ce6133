"""algorithm=gspo and algorithm=dapo as a user runs them: a short real run of each on a small
version of the default task (4 prompts, 2 new tokens) learns, and DAPO's batch stage drops
groups without signal and generates more."""

from __future__ import annotations

import pytest

from rltrain.runners.reasoning import run_reasoning
from rltrain.telemetry.metrics import read_metrics

from .test_reasoning import compose_run

#: "a+b=" for a, b in 0..1 with a 5-character alphabet: a random policy answers about 1 sample
#: in 30 (the answer and EOS), so groups of 8 are often all wrong early, which dynamic sampling
#: drops; a raised learning rate makes 20 steps enough to see the reward rise.
SMALL = (
    "task.max_operand=1",
    "model.vocab_chars='012+='",
    "rollout.max_new_tokens=2",
    "trainer.train_batch_size=4",
    "rollout.n_samples_per_prompt=8",
    "optimizer.lr=3e-3",
    "trainer.total_steps=20",
    "trainer.eval_every=0",
    "logging.progress=false",
)


def _rewards(path) -> list[float]:
    return [r["reward/mean"] for r in read_metrics(str(path / "metrics.jsonl"))]


def _rises(rewards: list[float]) -> bool:
    return sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.1


#: Each preset's run is its own test, so the two test processes can take one each.
pytestmark = [pytest.mark.timeout(600), pytest.mark.spread]


def test_gspo_preset_learns(ray_session, tmp_path):
    ray_session.ensure()
    # GSPO with two minibatches: the second step is off-policy, so the sequence clip binds
    gspo = compose_run("algorithm=gspo", "algorithm.num_minibatches=2", *SMALL)
    assert run_reasoning(gspo, str(tmp_path / "gspo"))["status"] == "completed"
    records = read_metrics(str(tmp_path / "gspo" / "metrics.jsonl"))
    assert max(r["actor/clip_frac"] for r in records) > 0
    assert _rises(_rewards(tmp_path / "gspo")), _rewards(tmp_path / "gspo")


def test_dapo_preset_learns_and_its_batch_stage_drops_and_regenerates(ray_session, tmp_path):
    ray_session.ensure()
    dapo = compose_run("algorithm=dapo", *SMALL)
    assert run_reasoning(dapo, str(tmp_path / "dapo"))["status"] == "completed"
    records = read_metrics(str(tmp_path / "dapo" / "metrics.jsonl"))
    assert records[0]["batch/dropped_group_share"] > 0  # a random policy: groups all wrong
    assert max(r["batch/generation_rounds"] for r in records) > 1
    assert all(r["batch/generation_rounds"] <= 4 for r in records)
    assert _rises(_rewards(tmp_path / "dapo")), _rewards(tmp_path / "dapo")
