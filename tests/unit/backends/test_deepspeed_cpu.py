"""DeepSpeed actor on CPU (gloo, world of one): ZeRO-1/2 steps with torch AdamW, offload sequencing.

On CPU ``offload_states`` is a host-to-host copy, so these tests check the API and the
sequencing (and that a round trip changes nothing), not memory; tests/gpu checks memory.
"""

from __future__ import annotations

import pytest
import torch

from rltrain.backends.deepspeed_engine import (
    DeepSpeedActor,
    DeepSpeedSettings,
    build_ds_config,
    check_deepspeed_limits,
)
from rltrain.config.offload import OffloadPolicy
from rltrain.errors import ConfigError, WorkerError

ALL = OffloadPolicy("after_stage", frozenset({"weights", "grads", "optimizer"}))


def _loss(engine, mb):
    x, y = mb
    return (engine(x) - y).square().mean()


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def _actor(stage: int, policy: OffloadPolicy = ALL) -> DeepSpeedActor:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    settings = DeepSpeedSettings(
        zero_stage=stage, dtype="float32", lr=1e-2, micro_batch_size=8, policy=policy
    )
    return DeepSpeedActor(model, settings)


# ------------------------------------------------------------------------- pure config checks
def test_limits_are_config_errors_naming_the_keys() -> None:
    check_deepspeed_limits(DeepSpeedSettings(zero_stage=2, policy=ALL), on_gpu=False)
    with pytest.raises(ConfigError) as err:
        check_deepspeed_limits(
            DeepSpeedSettings(zero_stage=3, dtype="float16", optimizer="sgd", policy=ALL),
            on_gpu=True,
        )
    text = str(err.value)
    assert "model.dtype='float16'" in text and "optimizer.name='sgd'" in text
    assert "actor.zero_stage=3 needs DeepSpeed's own fused Adam" in text
    # ZeRO-0 offloads the plain float32 optimizer; bfloat16 wraps it where nothing can move it
    check_deepspeed_limits(
        DeepSpeedSettings(zero_stage=0, dtype="float32", policy=ALL), on_gpu=False
    )
    with pytest.raises(ConfigError, match="actor.zero_stage=0 and model.dtype='bfloat16'"):
        check_deepspeed_limits(DeepSpeedSettings(zero_stage=0, policy=ALL), on_gpu=True)
    with pytest.raises(ConfigError, match="needs CUDA"):
        check_deepspeed_limits(
            DeepSpeedSettings(zero_stage=3, optimizer="deepspeed_adamw"), on_gpu=False
        )
    with pytest.raises(ConfigError, match="shards with ZeRO only"):
        check_deepspeed_limits(DeepSpeedSettings(tensor_parallel_size=2), on_gpu=True)
    # ZeRO-3 with offload is fine with DeepSpeed's fused Adam on GPUs.
    check_deepspeed_limits(
        DeepSpeedSettings(zero_stage=3, optimizer="deepspeed_adamw", policy=ALL), on_gpu=True
    )


def test_ds_config() -> None:
    s = DeepSpeedSettings(
        zero_stage=2, dtype="bfloat16", micro_batch_size=4, grad_accum_steps=3, grad_clip=0.5
    )
    cfg = build_ds_config(s, world_size=2)
    assert cfg["train_batch_size"] == 24 and cfg["gradient_accumulation_steps"] == 3
    assert cfg["zero_optimization"] == {"stage": 2} and cfg["bf16"] == {"enabled": True}
    assert cfg["fp16"] == {"enabled": False}
    assert cfg["gradient_clipping"] == 0.5 and "optimizer" not in cfg
    ds_adam = build_ds_config(DeepSpeedSettings(optimizer="deepspeed_adamw", lr=0.1), 1)
    assert ds_adam["optimizer"]["type"] == "AdamW" and ds_adam["optimizer"]["params"]["lr"] == 0.1


# ------------------------------------------------------------------------------- on DeepSpeed
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_offload_round_trips_do_not_change_training(stage: int, deepspeed_world) -> None:
    plain = _actor(stage, OffloadPolicy())
    moved = _actor(stage)
    losses_plain, losses_moved = [], []
    for _ in range(3):
        # One batch throughout, so the loss must fall.
        losses_plain.append(plain.train_step([_batch(0)], _loss))
        losses_moved.append(moved.train_step([_batch(0)], _loss))
        moved.after_stage()  # the policy says after_stage: everything leaves
        assert moved.offloaded == {"weights", "grads", "optimizer"}
        moved.reload_states()
        assert moved.offloaded == frozenset()
    assert losses_plain == losses_moved
    assert losses_moved[-1] < losses_moved[0]  # it learns
    for (n, a), (_, b) in zip(plain.named_weights(), moved.named_weights(), strict=True):
        assert torch.equal(a, b), n


def test_sequencing_is_enforced(deepspeed_world) -> None:
    actor = _actor(2)
    actor.train_step([_batch(0)], _loss)
    assert actor.offload_states(["optimizer"]) == {"optimizer"}
    assert actor.offload_states(["optimizer", "weights"]) == {"optimizer", "weights"}
    with pytest.raises(WorkerError, match="reload_states\\(\\) before train_step"):
        actor.train_step([_batch(1)], _loss)
    with pytest.raises(WorkerError, match="weights are offloaded"):
        next(actor.named_weights())
    with pytest.raises(ConfigError, match="cannot offload \\['kv_cache'\\]"):
        actor.offload_states(["kv_cache"])
    actor.reload_states()
    actor.reload_states()  # nothing offloaded: a no-op
    with pytest.raises(ConfigError, match="got 2 micro-batches for a step of 1"):
        actor.train_step([_batch(1), _batch(2)], _loss)
    assert actor.train_step([_batch(1)], _loss) > 0


def test_residency_interface_counts_bytes_by_kind(deepspeed_world) -> None:
    actor = _actor(1)
    # 16x32 + 32 + 32x4 + 4 = 676 fp32 parameters = 2704 B; before a step the optimizer holds
    # only the fp32 master partition (world of one: the whole model).
    assert actor.resident_bytes() == {"weights": 2704, "grads": 0, "optimizer": 2704}
    actor.train_step([_batch(0)], _loss)
    # + Adam's exp_avg and exp_avg_sq (2704 B each) and its 4-byte step counter.
    assert actor.resident_bytes() == {"weights": 2704, "grads": 0, "optimizer": 3 * 2704 + 4}
    assert actor.offload(["optimizer", "kv_cache"]) == 8116
    assert actor.resident_bytes()["optimizer"] == 0 and actor.host_bytes() == {"optimizer": 8116}
    assert actor.reload(["optimizer"]) == 8116
    assert actor.resident_bytes()["optimizer"] == 8116 and actor.host_bytes() == {}


def test_micro_batches_weigh_their_token_share_like_the_one_shot_step(deepspeed_world) -> None:
    # token_mean over rows of uneven length: DeepSpeed's own 1/n per micro-batch would give
    # another gradient than the whole minibatch's; the engine re-weighs each micro loss.
    from uneven_rows import scored_rows

    from rltrain.backends.training import DeepSpeedEngine, TorchEngine
    from rltrain.config.schema import ModelConfig, RunConfig
    from rltrain.tasks.model import build_model

    run = RunConfig()
    run.actor.backend, run.actor.zero_stage = "deepspeed", 1
    run.model = ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3)
    lengths = [1, 1, 1, 1, 1, 1, 1, 4]  # any 4 + 4 split is uneven
    batch = scored_rows(run, lengths, [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0], group_size=4)
    metrics = []
    for engine in (
        TorchEngine(run, build_model(run.model), torch.device("cpu"), 0),
        DeepSpeedEngine(run, build_model(run.model), torch.device("cpu"), 4, 8),
    ):
        engine.setup(1)
        metrics.append(engine.update(batch, torch.Generator().manual_seed(0)))
    one_shot, accumulated = metrics
    assert one_shot["actor/grad_norm"] > 0
    assert accumulated["actor/grad_norm"] == pytest.approx(one_shot["actor/grad_norm"], rel=1e-4)
    # the logged loss too: the micro-batches' metrics weigh their token shares, as the losses do
    assert one_shot["actor/pg_loss"] != 0
    for key in ("actor/pg_loss", "actor/entropy"):
        assert accumulated[key] == pytest.approx(one_shot[key], rel=1e-4), key


def test_stage_zero_moves_the_plain_optimizer_and_module(deepspeed_world) -> None:
    actor = _actor(0)
    actor.train_step([_batch(0)], _loss)
    # 676 fp32 parameters = 2704 B in 4 tensors; AdamW's two moments and a 4-byte step
    # counter per tensor (no flat partition at stage 0)
    assert actor.resident_bytes() == {"weights": 2704, "grads": 0, "optimizer": 2 * 2704 + 16}
    assert actor.offload(["weights", "optimizer"]) == 2704 + 2 * 2704 + 16
    assert actor.resident_bytes() == {"weights": 0, "grads": 0, "optimizer": 0}
    assert all(p.numel() == 0 for p in actor.module.parameters())  # the storage is gone
    actor.reload(None)
    assert actor.resident_bytes()["weights"] == 2704
    assert actor.train_step([_batch(1)], _loss) > 0


def test_deepspeed_engine_warmup_and_gradient_checkpointing(deepspeed_world) -> None:
    from toy_batches import toy_batch

    from rltrain.algorithms.update import UpdateSettings, add_advantages
    from rltrain.backends.training import DeepSpeedEngine
    from rltrain.config.schema import ModelConfig, RunConfig
    from rltrain.tasks.model import build_model

    batch = toy_batch([1, 2, 3, 4] * 2, [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    norms, lrs = {}, {}
    for ckpt in (False, True):
        run = RunConfig()
        run.actor.backend, run.actor.zero_stage = "deepspeed", 1
        run.actor.gradient_checkpointing = ckpt
        run.optimizer.lr, run.optimizer.warmup_steps = 0.01, 2
        run.model = ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3)
        b = add_advantages(batch, UpdateSettings.from_config(run))
        engine = DeepSpeedEngine(run, build_model(run.model), torch.device("cpu"), 8, 8)
        engine.setup(1)
        out = [engine.update(b, torch.Generator().manual_seed(0)) for _ in range(3)]
        norms[ckpt] = [o["actor/grad_norm"] for o in out]
        lrs[ckpt] = [o["actor/lr"] for o in out]
    assert lrs[False] == pytest.approx([0.005, 0.01, 0.01])  # one optimizer step per update
    assert norms[True] == pytest.approx(norms[False], rel=1e-5)  # checkpointing: same gradients


def test_a_zero3_checkpoint_holds_the_whole_model(deepspeed_world, tmp_path) -> None:
    # ZeRO-3 leaves every parameter an empty partition outside a gather: save_pretrained on
    # the module alone wrote empty tensors. The engine gathers them for the checkpoint, and
    # the saved model loads back equal to the one the engine was built from.
    from transformers import AutoModelForCausalLM

    from rltrain.backends.training import DeepSpeedEngine
    from rltrain.config.schema import ModelConfig, RunConfig
    from rltrain.tasks.model import build_model

    run = RunConfig()
    run.actor.backend, run.actor.zero_stage = "deepspeed", 3
    run.model = ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3)
    engine = DeepSpeedEngine(run, build_model(run.model), torch.device("cpu"), 4, 8)
    engine.setup(1)
    assert all(p.numel() == 0 for p in engine.model.parameters())  # partitioned away
    weights = engine.checkpoint_weights()
    assert weights is not None
    engine.model.save_pretrained(str(tmp_path), state_dict=weights)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    built = build_model(run.model)
    for (name, a), b in zip(built.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
