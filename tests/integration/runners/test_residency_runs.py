"""Residency with real workers: components sharing one simulated device take turns by policy."""

from __future__ import annotations

import pytest

from rltrain.config.schema import STATE_KINDS, OffloadPolicyConfig
from rltrain.errors import ResourceError
from rltrain.runners import reasoning
from rltrain.runners.reasoning import run_reasoning

from .test_reasoning import compose_run

pytestmark = pytest.mark.spread  # no module fixture: each test may run in either process

SETTINGS = (
    # kl_in=reward: the rollout records the sampler's log-probs for the per-token KL
    "algorithm.kl_coef=0.05",
    "algorithm.kl_in=reward",
    "trainer.total_steps=2",
    "trainer.eval_every=0",
    "trainer.train_batch_size=2",
    "logging.progress=false",
    # shorter sequences and micro batches keep the predicted activations small
    "model.max_position_embeddings=16",
    "actor.micro_batch_size=32",
)
# The plan predicts, on the one device: generate 0.87 MB (rollout weights + KV cache), logprob
# 2.6 MB (reference), train 5.9 MB (actor weights, grads, Adam, activations); the idle state of
# the other two is 0.35 MB each. 6.05 MB holds the actor's stage only when the others leave.
TIGHT = 0.00577


def one_device_run(*overrides: str, offload: dict | None = None, memory_gib: float = 4.0):
    run = compose_run(*SETTINGS, *overrides, f"cluster.device_memory_gib={memory_gib}")
    run.placement.component_placement = {
        "actor": "0",
        "rollout": "0",
        "reference": "0",
        "reward": {"node_group": "node", "placement": "0"},
    }
    run.reference.micro_batch_size = 32  # set with the placement: unplaced, it is refused
    if offload is not None:
        run.placement.offload = {
            c: OffloadPolicyConfig(when=w, states=list(STATE_KINDS)) for c, w in offload.items()
        }
    return run


def capture(monkeypatch):
    seen = {}
    real_fit = reasoning.ReasoningRunner.fit

    def fit(self):
        out = real_fit(self)
        seen["counts"] = self.job.residency.counts()
        seen["peak"] = dict(self.job.residency.peak)
        seen["capacity"] = dict(self.job.residency.capacity)
        seen["ledger"] = self.job.verify_ledger()
        return out

    monkeypatch.setattr(reasoning.ReasoningRunner, "fit", fit)
    return seen


@pytest.mark.timeout(300)
def test_three_components_take_turns_on_a_device_that_holds_one(ray_session, tmp_path, monkeypatch):
    ray_session.ensure()
    seen = capture(monkeypatch)
    run = one_device_run(
        offload={"actor": "after_stage", "rollout": "after_stage", "reference": "after_stage"},
        memory_gib=TIGHT,
    )
    summary = run_reasoning(run, str(tmp_path))
    assert summary["steps"] == 2
    dev = (0, 0)
    assert 0 < seen["peak"][dev] <= seen["capacity"][dev]
    c = seen["counts"]
    # after_stage: every component reloads for each of its stages and leaves after it
    assert c[("rollout", "reload")] == 2 + 1  # 2 generates + the final evaluation
    assert c[("reference", "reload")] == 2
    assert c[("actor", "reload")] == c[("actor", "offload")] - 1  # + the start-up offload
    assert all(
        r["measured"] <= r["declared"] + 256 * 1024 for rs in seen["ledger"].values() for r in rs
    )


def test_same_layout_with_offload_disabled_is_refused_before_start(tmp_path):
    run = one_device_run(offload={}, memory_gib=TIGHT)
    with pytest.raises(ResourceError) as info:
        run_reasoning(run, str(tmp_path))
    text = str(info.value)
    assert "device" in text and "placement.offload" in text


@pytest.mark.timeout(300)
def test_on_demand_with_a_roomy_device_never_offloads(ray_session, tmp_path, monkeypatch):
    ray_session.ensure()
    seen = capture(monkeypatch)
    run = one_device_run(
        offload={"actor": "on_demand", "rollout": "on_demand", "reference": "on_demand"}
    )
    run_reasoning(run, str(tmp_path))
    assert seen["counts"] == {}
