"""PPO in the reasoning runner, for real: a critic group beside the actor on the local Ray."""

from __future__ import annotations

import json

import pytest

from rltrain.errors import ConfigError, PlacementError
from rltrain.runners.layout import check_components
from rltrain.runners.reasoning import run_reasoning
from rltrain.telemetry.metrics import read_metrics

from .test_reasoning import compose_run

pytestmark = pytest.mark.spread  # no module fixture: each test may run in either process

#: One prompt, "0+0=", a 6-token alphabet and one new token: about 1 sample in 6 answers "0",
#: so the 32 samples of a step carry a reward signal for the critic to learn (a random policy on
#: the default task almost never earns one).
LEAN = (
    "experiment=reasoning_ppo",
    "task.max_operand=0",
    "model.vocab_chars='0+='",
    "rollout.max_new_tokens=1",
    "trainer.train_batch_size=2",
    "rollout.n_samples_per_prompt=16",
    "trainer.eval_every=0",
    "logging.progress=false",
)


@pytest.mark.timeout(400)
def test_ppo_collocated_trains_the_critic_and_resumes_it(ray_session, tmp_path):
    ray_session.ensure()
    summary = run_reasoning(compose_run(*LEAN, "trainer.total_steps=1"), str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 1
    (first,) = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert first["reward/mean"] > 0, "no sample earned a reward: the critic has nothing to fit"
    assert first["critic/values_mean"] == 0.0  # a fresh critic predicts 0 everywhere
    assert first["critic/returns_mean"] > 0 and first["critic/value_loss"] > 0
    assert first["time/critic_s"] > 0 and "actor/pg_loss" in first
    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    assert (tmp_path / "checkpoints" / latest / "critic" / "model.safetensors").is_file()
    # a value model with dropout (one loaded from model.path) draws on after a resume
    assert (tmp_path / "checkpoints" / latest / "critic" / "rng" / "critic_rank0.pt").is_file()
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {"values", "train"} <= {e.get("name") for e in trace["traceEvents"]}

    # resumed: the critic's values at step 1 are those of the trained critic in the checkpoint
    # (a fresh one would predict exactly 0 again)
    resumed = compose_run(*LEAN, "trainer.total_steps=2", "trainer.resume=auto")
    assert run_reasoning(resumed, str(tmp_path))["steps"] == 1
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1]
    assert records[1]["critic/values_mean"] != 0.0


def test_ppo_without_a_critic_and_a_critic_without_ppo_are_refused_before_ray():
    run = compose_run(*LEAN)
    with pytest.raises(ConfigError, match=r"placement.component_placement.*needs a critic"):
        check_components(run, {"actor", "rollout", "reward"})
    run = compose_run("+placement.component_placement.critic=all")
    with pytest.raises(ConfigError, match="does not use one"):
        check_components(run, {"actor", "rollout", "reward", "critic"})
    with pytest.raises(ConfigError, match="experiment=reasoning_ppo"):
        compose_run("algorithm.advantage_estimator=gae")  # the config check, at load time


def test_ppo_with_the_disaggregated_placement_points_at_the_preset(tmp_path):
    run = compose_run("algorithm=ppo", "placement=disaggregated")  # the critic: all devices
    with pytest.raises(PlacementError, match="experiment=reasoning_ppo_disaggregated"):
        run_reasoning(run, str(tmp_path))  # the plan refuses it before Ray starts
