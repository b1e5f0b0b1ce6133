"""The engines the config names, in real runs on the session's local Ray (simulated devices):
the collective weight-sync transport (gloo) against the object store, a reward model, and the
inference component."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import torch
from composed import composed_run as compose_run
from residency_probe import record_residency_counts

from rltrain.runners import reasoning
from rltrain.runners.stages import ReasoningStages
from rltrain.telemetry.metrics import read_metrics
from rltrain.workers.rollout import RolloutWorker

# spread: each test may run in either process, except the two that read ``scored_run``
pytestmark = pytest.mark.spread
#: The unit of the tests that read the module's ``scored_run`` (one process runs it once).
SCORED_RUN = pytest.mark.spread(unit="test_engines-scored-run")

SHORT = (
    "trainer.total_steps=3",
    "trainer.eval_every=3",
    "trainer.train_batch_size=4",
    "rollout.n_samples_per_prompt=4",
    "logging.progress=false",
)


class WeightsRollout(RolloutWorker):
    """The rollout, plus a look at the weights it holds."""

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}


def _steps_with_rollout_weights(run, run_dir: str, steps: int):
    """Train ``steps`` steps; after each, the rollout takes the new version and shows it."""
    from rltrain.runners.job import start_job
    from rltrain.runners.layout import preflight

    layout = preflight(run)
    builders = reasoning.worker_builders(run, layout.fused)
    builders["rollout"] = lambda layout: WeightsRollout.create_group(run)
    records, weights = [], []
    with start_job(run, run_dir, builders, layout, on_launch=reasoning.data_parallel) as job:
        runner = reasoning.ReasoningRunner(job)
        runner.schedule.begin(0, steps)
        for step in range(steps):
            records.append(runner.train_step(step))
            with job.stage("rollout"):
                job.groups["rollout"].call(RolloutWorker.catch_up, runner.weights_ref).wait()
                weights.append(job.groups["rollout"].call(WeightsRollout.weights).wait()[0])
        runner.schedule.end(steps, clean=True)
        job.verify_ledger()
        summary = reasoning.weight_sync_summary(runner)
    return records, weights, summary


@pytest.mark.timeout(600)
def test_collective_transport_delivers_the_host_transports_weights(ray_session, tmp_path):
    """Disaggregated (actor on device 0, rollout on device 1), 3 steps each way: after every
    update the rollout holds bit for bit the same weights by gloo broadcast as by the object
    store, so both runs learn the same."""
    ray_session.ensure()
    base = ("placement=disaggregated", "algorithm.entropy_coef=0.05", *SHORT)
    host = _steps_with_rollout_weights(
        compose_run(*base, "weight_sync.transport=host"), str(tmp_path / "host"), 3
    )
    coll = _steps_with_rollout_weights(
        compose_run(*base, "weight_sync.transport=collective"), str(tmp_path / "coll"), 3
    )
    assert host[2]["rollout"]["transport"] == "host"
    assert coll[2]["rollout"] == {
        "transport": "collective",
        "reason": coll[2]["rollout"]["reason"],
        "backend": "gloo",
        "groups": {"0": [0]},
    }
    for step, (a, b) in enumerate(zip(host[1], coll[1], strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), (step, name)
    # the weights moved at every step (the comparison is not between two initial models)
    first, last = host[1][0], host[1][-1]
    assert any(not torch.equal(first[n], last[n]) for n in first)
    for ra, rb in zip(host[0], coll[0], strict=True):
        for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert ra[key] == rb[key], key


def _tiny_reward_model(path: pathlib.Path, seed: int = 7) -> None:
    """A random Llama sequence classifier with one output, over the policy's tokenizer."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rltrain.config.schema import ModelConfig
    from rltrain.tasks import build_tokenizer

    tok = build_tokenizer(ModelConfig())
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        num_labels=1,
    )
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(str(path))
    tok.save_pretrained(str(path))


def _model_scores(path: pathlib.Path, texts: list[str]) -> torch.Tensor:
    """The reward model's own scores, one text at a time (no padding at all)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    with torch.no_grad():
        return torch.cat([model(**tok([t], return_tensors="pt")).logits[:, 0] for t in texts])


@pytest.fixture(scope="module")
def scored_run(ray_session, tmp_path_factory) -> dict[str, Any]:
    """One collocated run, 3 steps, for the reward model and the inference component: a tiny
    reward model on device 0 beside actor and rollout that sends its weights away after every
    scoring, and the inference component on device 1. What each test reads is recorded on the
    way: each step's shards and scores, the residency counts, and each step's inference
    log-probs with the actor's policy before the step's update."""
    import ray

    from rltrain.backends.weight_sync.host import load_from_host
    from rltrain.tasks.model import build_model

    ray_session.ensure()
    rm = tmp_path_factory.mktemp("reward_model")
    _tiny_reward_model(rm)
    out = tmp_path_factory.mktemp("scored_run")
    steps: list[dict[str, Any]] = []
    inference: list = []
    real_learn = ReasoningStages.learn
    real_metrics = ReasoningStages.step_metrics
    real_inference = ReasoningStages.inference_logprobs

    def learn(self, step, shards, timer):
        steps.append({"shards": ray.get(list(shards))})
        return real_learn(self, step, shards, timer)

    def step_metrics(self, scores, results, times):
        steps[-1]["scores"] = torch.cat([sc.rewards for sc in scores])
        return real_metrics(self, scores, results, times)

    def inference_logprobs(self, shards):
        old = real_inference(self, shards)
        # the actor's policy as it is before this step's update (the version it exported)
        model = build_model(self.run.model)
        load_from_host(ray.get(self.weights_ref), dict(model.named_parameters()))
        inference.append((ray.get(list(shards)), old, model))
        return old

    run = compose_run(
        "placement=collocated",
        "placement.mode=null",
        "+placement.component_placement.inference=1",
        "reward.kind=model",
        f"reward.model_path={rm}",
        "reward.micro_batch_size=3",  # 8 rows per shard: micro-batches of 3, 3 and 2
        "placement.component_placement.reward=0",  # on device 0, beside actor and rollout
        "+placement.offload.reward={when: after_stage, states: [weights]}",
        "algorithm.entropy_coef=0.05",
        *SHORT,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReasoningStages, "learn", learn)
        patch.setattr(ReasoningStages, "step_metrics", step_metrics)
        patch.setattr(ReasoningStages, "inference_logprobs", inference_logprobs)
        counts = record_residency_counts(patch)
        summary = reasoning.run_reasoning(run, str(out))
    return {
        "run": run,
        "dir": out,
        "reward_model": rm,
        "summary": summary,
        "steps": steps,
        "inference": inference,
        "counts": counts,
    }


@SCORED_RUN
@pytest.mark.timeout(600)
def test_reward_model_scores_what_the_run_logs(scored_run):
    from rltrain.algorithms.sampling import decode_responses
    from rltrain.tasks import build_tokenizer

    run, rm, summary, seen = (scored_run[k] for k in ("run", "reward_model", "summary", "steps"))
    assert summary["status"] == "completed" and summary["fused"] is False
    assert any("reward.kind='model'" in b for b in summary["fuse_blockers"])
    records = read_metrics(str(scored_run["dir"] / "metrics.jsonl"))
    counts = scored_run["counts"]
    # resident state on device 0: its policy sends the weights away after every scoring
    assert counts[("reward", "offload")] >= 3 and counts[("reward", "reload")] >= 3
    assert len(seen) == len(records) == 3
    tok = build_tokenizer(run.model)
    for step, record in zip(seen, records, strict=True):
        texts = []
        for b in step["shards"]:
            prompts = tok.batch_decode(b.prompt_ids.tolist(), skip_special_tokens=True)
            responses = decode_responses(tok, b, tok.eos_token_id)
            texts += [p + r for p, r in zip(prompts, responses, strict=True)]
        want = _model_scores(rm, texts)
        torch.testing.assert_close(step["scores"], want, rtol=1e-5, atol=1e-5)
        assert record["reward/mean"] == pytest.approx(float(want.mean()), abs=1e-5)
        # every row fits the reward model's 64 positions; the budget cut some responses
        assert record["reward/truncated"] == 0
        cut = sum(int(b.truncated.sum()) for b in step["shards"])
        assert record["response/truncated"] == cut
    assert len({float(s["scores"].std()) for s in seen}) > 1  # real, varying scores


@SCORED_RUN
@pytest.mark.timeout(600)
def test_inference_component_computes_the_actors_old_logprobs(scored_run):
    from rltrain.algorithms.logprobs import compute_logprobs

    run_dir, seen = scored_run["dir"], scored_run["inference"]
    assert scored_run["summary"]["weight_sync"]["inference"]["transport"] == "host"
    assert len(seen) == 3
    for shards, old, model in seen:
        for b, lp in zip(shards, old, strict=True):
            want = compute_logprobs(
                model, b.input_ids, b.attention_mask, b.response_mask, temperature=1.0
            )
            torch.testing.assert_close(lp, want, rtol=0, atol=1e-6)
    # the actor's own forward pass agrees: its ratio against these old_logprobs starts at 1
    records = read_metrics(str(run_dir / "metrics.jsonl"))
    assert all(abs(r["actor/approx_kl"]) < 1e-6 and r["actor/clip_frac"] == 0 for r in records)
    assert all(r["time/inference_s"] > 0 for r in records)
    trace = json.loads((run_dir / "trace.json").read_text())
    lanes = {
        e["args"].get("process")
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("name") == "inference"
    }
    assert lanes == {"inference[0]"}
