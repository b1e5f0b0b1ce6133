"""The PPO critic worker as a plain class: sizes, values, value training, residency, checkpoints."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from rltrain.algorithms import RolloutBatch
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.placement import memory
from rltrain.placement.plan import component_terms
from rltrain.placement.sizes import derive_critic_sizes
from rltrain.placement.types import GIB
from rltrain.workers.critic import CriticWorker

T = torch.tensor
REWARDS = T([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
LENGTHS = T([1, 2, 4, 3, 4, 1, 2, 3])


def _run(**algorithm) -> RunConfig:
    run = RunConfig()
    run.model.hidden_size, run.model.intermediate_size = 32, 64
    a = run.algorithm
    a.advantage_estimator, a.gamma, a.lam, a.value_clip = "gae", 1.0, 1.0, 10.0
    a.num_minibatches = 2
    run.critic.lr, run.critic.micro_batch_size = 1e-2, 3
    for k, v in algorithm.items():
        setattr(a, k, v)
    return run


def _batch() -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(4)[None, :] < LENGTHS[:, None]).float()
    prompt_mask = torch.ones(8, 3, dtype=torch.long)
    prompt_mask[::2, 0] = 0
    return RolloutBatch(
        prompt_ids=torch.randint(3, 20, (8, 3), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, 20, (8, 4), generator=g) * mask.long(),
        response_mask=mask,
        group_size=4,
    )


@pytest.fixture()
def critic() -> CriticWorker:
    torch.set_num_threads(1)
    return CriticWorker(_run(), derive_critic_sizes(_run(), 8, 1))


def test_sizes_split_the_step_over_ranks_and_minibatches():
    s = derive_critic_sizes(_run(), samples_per_step=16, critic_world=2)
    assert (s.dp, s.samples_per_rank, s.samples_per_minibatch, s.micro_batch) == (2, 8, 4, 3)
    with pytest.raises(ConfigError, match=r"placement.component_placement.critic\) x algorithm"):
        derive_critic_sizes(_run(), samples_per_step=12, critic_world=4)


def test_a_fresh_critic_predicts_zero_and_training_fits_the_returns(critic):
    batch = _batch()
    values = critic.values([batch])[0]
    assert values.shape == (8, 4) and torch.count_nonzero(values) == 0  # zero-initialised head
    losses = []
    for step in range(25):
        shard = batch.replace(values=critic.values([batch])[0])
        m = critic.train(shard, rewards=[REWARDS], step=step)
        losses.append(m.metrics["critic/value_loss"])
    # gamma = lam = 1: every token's target is its row's reward; 6 of the 20 tokens earn 1
    assert m.metrics["critic/returns_mean"] == pytest.approx(6 / 20)
    assert losses[-1] < 0.1 * losses[0], losses
    fitted = critic.values([batch])[0]
    target = REWARDS[:, None] * batch.response_mask
    assert (fitted - target).abs().max() < 0.3
    assert m.state_bytes["optimizer"] > 0 and m.metrics["critic/grad_norm"] > 0
    critic.memory_report()  # no device tensor outside the declared state


def test_training_without_values_or_gae_is_refused(critic):
    with pytest.raises(ConfigError, match="with_values"):
        critic.train(_batch(), rewards=[REWARDS], step=0)
    grpo_run = _run(advantage_estimator="grpo")
    grpo = CriticWorker(grpo_run, derive_critic_sizes(grpo_run, 8, 1))
    shard = _batch().replace(values=torch.zeros(8, 4))
    with pytest.raises(ConfigError, match="gae only"):
        grpo.train(shard, rewards=[REWARDS], step=0)


def test_offload_and_reload_keep_the_values_bit_for_bit(critic):
    batch = _batch()
    critic.train(batch.replace(values=critic.values([batch])[0]), rewards=[REWARDS], step=0)
    before = critic.values([batch])[0]
    assert critic.offload(["weights", "grads", "optimizer"]) > 0
    assert sum(critic.mover.resident_bytes().values()) == 0
    critic.reload(["weights", "grads", "optimizer"])
    assert torch.equal(critic.values([batch])[0], before)


def test_the_plan_predicts_the_critic_state_it_holds(critic):
    batch = _batch()
    critic.train(batch.replace(values=critic.values([batch])[0]), rewards=[REWARDS], step=0)
    run = critic.run
    params = sum(p.numel() for p in critic.model.parameters())
    dims = memory.model_dims(run.model)
    vocab = critic.model.backbone.config.vocab_size  # the plan assumes 32 for the built-in one
    assert memory.value_param_count(dataclasses.replace(dims, vocab_size=vocab)) == params
    node = types.SimpleNamespace(accelerator_type="sim", device_memory_bytes=4 * GIB)
    predicted = component_terms(run, "critic", 1, 1, node, dims)
    measured = critic.state_bytes()
    for kind in ("weights", "grads", "optimizer"):
        assert measured[kind] == pytest.approx(predicted[kind], rel=0.02), kind


def test_checkpoint_round_trip_and_mismatches(critic, tmp_path):
    batch = _batch()
    critic.train(batch.replace(values=critic.values([batch])[0]), rewards=[REWARDS], step=0)
    critic.save(str(tmp_path / "ckpt"))
    fresh = CriticWorker(_run(), derive_critic_sizes(_run(), 8, 1))
    assert not torch.equal(fresh.values([batch])[0], critic.values([batch])[0])
    fresh.load(str(tmp_path / "ckpt"))
    assert torch.equal(fresh.values([batch])[0], critic.values([batch])[0])
    a, b = critic.engine.optimizer.state_dict(), fresh.engine.optimizer.state_dict()
    assert torch.equal(a["state"][0]["exp_avg"], b["state"][0]["exp_avg"])

    with pytest.raises(ConfigError, match="holds no critic"):
        fresh.load(str(tmp_path / "elsewhere"))
    other = _run()
    other.model.hidden_size, other.model.num_heads, other.model.num_kv_heads = 16, 2, 2
    with pytest.raises(ConfigError, match="critic of another model"):
        CriticWorker(other, derive_critic_sizes(other, 8, 1)).load(str(tmp_path / "ckpt"))


def test_a_bf16_critic_trains_fp32_masters_and_keeps_its_head_in_fp32():
    run = _run()
    run.model.dtype = "bfloat16"
    critic = CriticWorker(run, derive_critic_sizes(run, 8, 1))
    opt = critic.engine.optimizer
    head = critic.model.head.weight
    assert head.dtype == torch.float32 and critic.model.backbone.dtype == torch.bfloat16
    batch = _batch()
    before = head.detach().clone()
    critic.train(batch.replace(values=critic.values([batch])[0]), rewards=[REWARDS], step=0)
    assert not torch.equal(before, head)
    masters = dict(zip(map(id, opt.params), opt.masters, strict=True))
    assert masters[id(head)] is head  # an fp32 parameter is its own master
    trunk = next(p for p in critic.model.backbone.parameters())
    assert masters[id(trunk)].dtype == torch.float32 and trunk.dtype == torch.bfloat16
    report = critic.memory_report()
    assert report["measured"] == report["declared"]
