"""LoRA adapters on the actor (``actor.lora.*``): the merged export, adapter-only training, the
adapters-disabled reference, the plan's memory, peft-format checkpoints with exact resume, and
the checks made before Ray starts."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch
from toy_batches import toy_batch

from rltrain.algorithms import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, behaviour_logprobs
from rltrain.backends import lora as L
from rltrain.backends.training import build_engine
from rltrain.backends.weight_sync.host import load_from_host, pack_to_host
from rltrain.config import load_config
from rltrain.config.engine_checks import LORA_TARGETS
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.placement import memory
from rltrain.placement.plan import component_terms
from rltrain.placement.sizes import derive_sizes
from rltrain.placement.types import GIB
from rltrain.runners.checkpoint import experiment_key, model_fingerprint
from rltrain.runners.layout import check_components
from rltrain.tasks.model import build_model
from rltrain.workers.actor import ActorWorker

CPU = torch.device("cpu")
LENGTHS = torch.tensor([1, 2, 4, 3, 4, 1, 2, 3])
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
LORA_AB = ("lora_A.default", "lora_B.default")
PLACEMENT = {"component_placement": {"actor,rollout": "all", "reward": "0"}}


def _run(rank: int = 4, **lora) -> RunConfig:
    run = RunConfig()
    run.model.hidden_size, run.model.intermediate_size = 32, 64
    run.trainer.train_batch_size, run.rollout.n_samples_per_prompt = 2, 4
    run.optimizer.lr = 1e-2
    run.actor.lora.rank, run.actor.lora.alpha = rank, 8.0
    for k, v in lora.items():
        setattr(run.actor.lora, k, v)
    return run


def _batch() -> RolloutBatch:
    return toy_batch(LENGTHS.tolist(), rewards=None)


def _randomise_adapters(model: torch.nn.Module, seed: int = 1) -> None:
    """B starts at zero (the merged model is the base): give it values to see the merge."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------ the engine
def test_merged_export_is_w_plus_scaled_b_a_by_hand_under_plain_names():
    run = _run(rank=2, target_modules=["q_proj", "down_proj"])
    plain = build_model(run.model)
    engine = build_engine(run, build_model(run.model), CPU, micro_batch=8, minibatch=8)
    _randomise_adapters(engine.model)
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    exported = engine.named_weights()
    # the names and order of the plain model, no peft prefixes or adapter tensors
    assert [n for n, _ in exported] == [n for n, _ in plain.named_parameters()]
    got = dict(exported)
    prefix = "base_model.model."
    for layer, module in (("0", "self_attn.q_proj"), ("1", "mlp.down_proj")):
        name = f"model.layers.{layer}.{module}"
        w = before[f"{prefix}{name}.base_layer.weight"]
        a = before[f"{prefix}{name}.lora_A.default.weight"]
        b = before[f"{prefix}{name}.lora_B.default.weight"]
        assert a.shape == (2, w.shape[1]) and b.shape == (w.shape[0], 2)
        want = w + (8.0 / 2) * b @ a  # alpha / r = 4
        torch.testing.assert_close(got[f"{name}.weight"], want, rtol=0, atol=1e-6)
        assert not torch.equal(got[f"{name}.weight"], w)
    # untargeted layers pass as they are, and the trained model is not merged in place
    k = "model.layers.0.self_attn.k_proj.weight"
    assert torch.equal(got[k], before[prefix + k])
    for n, p in engine.model.named_parameters():
        assert torch.equal(p, before[n]), n
    # a plain receiver takes the export through weight sync (strict names) and computes what
    # the adapted policy computes
    assert load_from_host(pack_to_host(exported, version=1), dict(plain.named_parameters())) == len(
        exported
    )
    ids = torch.randint(3, 20, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, engine.model(input_ids=ids).logits)


def test_an_update_changes_the_adapters_only_and_the_optimizer_holds_only_them():
    run = _run()
    engine = build_engine(run, build_model(run.model), CPU, micro_batch=4, minibatch=8)
    trainable = [n for n, p in engine.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    held = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in engine.model.parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    from rltrain.algorithms.update import add_advantages

    batch = add_advantages(_batch().replace(rewards=REWARDS), UpdateSettings.from_config(run))
    engine.update(batch, torch.Generator().manual_seed(0))
    changed = {n for n, p in engine.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= set(trainable)
    assert any(".lora_B." in n for n in changed)  # B leaves zero: the policy moved
    assert len(engine.optimizer.state) == len(trainable)


def test_reference_logprobs_with_adapters_disabled_equal_the_base_models():
    run = _run()
    base = build_model(run.model)  # same init_seed: the weights the actor starts from
    engine = build_engine(run, build_model(run.model), CPU, micro_batch=8, minibatch=8)
    _randomise_adapters(engine.model)
    s = UpdateSettings.from_config(run)
    batch = _batch()
    want = behaviour_logprobs(base, batch, s)
    engine.model.train()
    got = L.reference_logprobs(engine.model, batch, s, micro_batch=3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert engine.model.training  # the mode is restored
    adapted = behaviour_logprobs(engine.model, batch, s)
    assert (adapted - want).abs().max() > 1e-3  # the adapters do change the policy


# ------------------------------------------------------------------------------ the worker
def test_the_actor_takes_the_kl_against_its_own_base_when_no_reference_is_placed():
    run = _run()
    run.algorithm.kl_coef = 0.5
    actor = ActorWorker(run, derive_sizes(run, 1, 1))
    _randomise_adapters(actor.model)
    base = build_model(run.model)
    batch = _batch()
    filled = actor.own_reference(batch)
    want = behaviour_logprobs(base, batch, actor.settings)
    torch.testing.assert_close(filled.ref_logprobs, want, rtol=0, atol=1e-6)
    given = batch.replace(ref_logprobs=torch.zeros(8, 4))  # a placed reference's: kept
    assert torch.equal(actor.own_reference(given).ref_logprobs, given.ref_logprobs)
    result = actor.train(batch, rewards=[REWARDS], step=0)
    assert result.metrics["actor/kl_loss"] > 0  # the adapters moved away from the base
    # the KL in the reward: reference and behaviour log-probs are filled before the advantages
    # (without them add_advantages refuses the batch)
    run.algorithm.kl_in = "reward"
    assert ActorWorker(run, derive_sizes(run, 1, 1)).train(batch, rewards=[REWARDS], step=0)
    run.actor.lora.rank = 0  # without LoRA nothing is filled in
    assert ActorWorker(run, derive_sizes(run, 1, 1)).own_reference(batch).ref_logprobs is None


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_checkpoint_is_in_peft_format_and_resumes_exactly(tmp_path, dropout):
    run = _run(dropout=dropout)  # dropout: the update draws from the global torch RNG
    sizes = derive_sizes(run, 1, 1)
    first = ActorWorker(run, sizes)
    first.train(_batch(), rewards=[REWARDS], step=0)
    first.save(str(tmp_path / "ckpt"))
    # first and fresh stand for two processes: each update runs from its own process's RNG
    uninterrupted = torch.get_rng_state()
    adapter = tmp_path / "ckpt" / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(adapter))
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    assert sorted(config["target_modules"]) == sorted(run.actor.lora.target_modules)
    from safetensors.torch import load_file

    base = load_file(str(tmp_path / "ckpt" / "model" / "model.safetensors"))
    assert not any("lora" in k or "base_layer" in k for k in base)  # plain HF names
    fresh = ActorWorker(run, sizes)  # seeds the RNG and draws the adapters' initial values
    fresh.load(str(tmp_path / "ckpt"))
    for (n, a), (_, b) in zip(
        first.model.named_parameters(), fresh.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), n
    # the next update is the uninterrupted run's, bit for bit (adapters, Adam state, the
    # dropout's draws)
    m2 = fresh.train(_batch(), rewards=[REWARDS], step=1).metrics
    torch.set_rng_state(uninterrupted)
    m1 = first.train(_batch(), rewards=[REWARDS], step=1).metrics
    assert m1 == m2
    for (n, a), (_, b) in zip(
        first.model.named_parameters(), fresh.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), n
    # a full-training run cannot take it, nor another adapter shape
    full = _run(rank=0)
    with pytest.raises(ConfigError, match="holds a LoRA adapter"):
        ActorWorker(full, derive_sizes(full, 1, 1)).load(str(tmp_path / "ckpt"))
    wider = _run(rank=8)
    with pytest.raises(ConfigError, match="does not fit actor.lora"):
        ActorWorker(wider, derive_sizes(wider, 1, 1)).load(str(tmp_path / "ckpt"))


@pytest.mark.parametrize("stage", [0, 2])
def test_deepspeed_trains_the_adapters_exports_merged_and_resumes_exactly(
    stage, deepspeed_world, tmp_path
):
    run = _run()
    run.actor.backend, run.actor.zero_stage = "deepspeed", stage
    run.algorithm.kl_coef = 0.2  # no reference placed: the actor's base is the reference
    sizes = derive_sizes(run, 1, 1)
    first = ActorWorker(run, sizes)
    first.setup_data_parallel()
    before = {n: p.detach().clone() for n, p in first.model.named_parameters()}
    first.train(_batch(), rewards=[REWARDS], step=0)
    changed = {n for n, p in first.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed)
    name = "model.layers.1.self_attn.v_proj"
    p = dict(first.model.named_parameters())
    w, a, b = (p[f"base_model.model.{name}.{k}.weight"] for k in ("base_layer", *LORA_AB))
    exported = dict(first.engine.named_weights())
    torch.testing.assert_close(exported[f"{name}.weight"], w + 2.0 * b @ a, rtol=0, atol=1e-6)
    first.save(str(tmp_path / "ckpt"))
    fresh = ActorWorker(run, sizes)
    fresh.setup_data_parallel()
    fresh.load(str(tmp_path / "ckpt"))
    m1 = first.train(_batch(), rewards=[REWARDS], step=1).metrics
    m2 = fresh.train(_batch(), rewards=[REWARDS], step=1).metrics
    assert m1 == m2 and m1["actor/kl_loss"] > 0
    for (n, x), (_, y) in zip(
        first.model.named_parameters(), fresh.model.named_parameters(), strict=True
    ):
        assert torch.equal(x, y), n


# ------------------------------------------------------------------------------ the plan
def test_plan_sizes_gradients_and_adam_for_the_adapters_only_by_hand():
    # Qwen2-0.5B's shapes: h 896, i 4864, 24 layers, 14 heads, 2 KV heads (kv_dim 128)
    d = memory.ModelDims(896, 4864, 24, 14, 2, 151936, 32768, "bfloat16", True, True)
    # q, v: r·(896+896) + r·(896+128) = 8·1792 + 8·1024 = 22528 per layer, x24
    assert memory.lora_param_count(d, 8, ["q_proj", "v_proj"]) == 540_672
    assert set(memory.lora_linear_shapes(d)) == set(LORA_TARGETS)
    run = _run(rank=8, target_modules=["q_proj", "v_proj"])
    run.actor.micro_batch_size = 1
    node = types.SimpleNamespace(accelerator_type="sim", device_memory_bytes=80 * GIB)
    full_run = _run(rank=0)
    full_run.actor.micro_batch_size = 1
    full = component_terms(full_run, "actor", 1, 1, node, d)
    adapted = component_terms(run, "actor", 1, 1, node, d)
    params = memory.param_count(d)
    assert params == 494_032_768
    # full: grads 2 B/param, Adam 8 + 4 (fp32 master under bf16) B/param
    assert (full["grads"], full["optimizer"]) == (params * 2, params * 12)
    assert adapted["weights"] == (params + 540_672) * 2  # the base stays, plus the adapters
    assert (adapted["grads"], adapted["optimizer"]) == (540_672 * 2, 540_672 * 12)
    saved = full["grads"] + full["optimizer"] - adapted["grads"] - adapted["optimizer"]
    assert saved == (494_032_768 - 540_672) * 14  # 6.43 GiB less on the actor's device
    with pytest.raises(ConfigError, match="lm_head"):
        memory.lora_param_count(d, 8, ["lm_head"])


def test_measured_state_matches_the_plan():
    run = _run(rank=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"])
    actor = ActorWorker(run, derive_sizes(run, 1, 1))
    actor.train(_batch(), rewards=[REWARDS], step=0)  # Adam's state exists after a step
    measured = actor.state_bytes()
    plain = build_model(run.model)
    built = sum(t.numel() for t in (*plain.parameters(), *plain.buffers()))  # + rotary freqs
    d = memory.model_dims(run.model)
    node = types.SimpleNamespace(accelerator_type="sim", device_memory_bytes=4 * GIB)
    planned = component_terms(run, "actor", 1, 1, node, d)
    adapters = memory.lora_param_count(d, 4, run.actor.lora.target_modules)
    assert adapters == sum(p.numel() for p in actor.model.parameters() if p.requires_grad)
    steps = 4 * len(actor.optimizer.state)  # AdamW's per-parameter step counters
    assert measured["optimizer"] - steps == planned["optimizer"] == adapters * 8
    assert measured["weights"] == (built + adapters) * 4
    # grads: set_to_none leaves only the adapters' gradients, at most their size
    assert measured["grads"] <= planned["grads"] == adapters * 4
    report = actor.memory_report()  # the ledger's independent walk finds nothing undeclared
    assert report["measured"] == report["declared"] == sum(measured.values())


# ------------------------------------------------------------------------------ before Ray
def test_a_reference_is_optional_under_lora_and_refusals_name_the_keys():
    run = _run()
    run.algorithm.kl_coef = 0.1
    base = {"actor", "rollout", "reward"}
    check_components(run, base)  # the actor is its own reference
    check_components(run, base | {"reference"})  # a placed one still works
    run.actor.lora.rank = 0
    with pytest.raises(ConfigError, match="needs \\['actor', 'rollout', 'reward', 'reference'\\]"):
        check_components(run, base)
    ppo = _run()
    ppo.algorithm.kl_coef, ppo.algorithm.kl_in = 0.1, "reward"
    ppo.algorithm.advantage_estimator = "gae"
    with pytest.raises(ConfigError, match="kl_in='reward' with a critic"):
        check_components(ppo, base | {"critic"})
    check_components(ppo, base | {"critic", "reference"})

    def problems(**overrides) -> str:
        cfg = {"actor": {"lora": {"rank": 4}}, "placement": PLACEMENT, **overrides}
        with pytest.raises(ConfigError) as err:
            load_config(cfg)
        return str(err.value)

    text = problems(
        actor={"lora": {"rank": 4, "alpha": 0, "dropout": 1.0, "target_modules": ["c_attn"]}}
    )
    assert "actor.lora.alpha=0" in text and "actor.lora.dropout=1.0" in text
    assert "['c_attn'] is not one" in text
    text = problems(actor={"backend": "deepspeed", "zero_stage": 3, "lora": {"rank": 4}})
    assert "actor.zero_stage=3" in text and "actor.lora.rank=0" in text
    assert "actor.lora.rank=-1 must be >= 0" in problems(actor={"lora": {"rank": -1}})
    load_config({"actor": {"lora": {"rank": 4}}, "placement": PLACEMENT})  # defaults are valid


def test_checkpoint_identity_carries_the_adapter_shape():
    plain, adapted = _run(rank=0), _run(rank=8)
    assert "lora" not in model_fingerprint(plain)
    assert model_fingerprint(adapted).endswith("+lora-r8-k_proj,o_proj,q_proj,v_proj")
    assert experiment_key(plain) != experiment_key(adapted)
    assert "lora" not in experiment_key(plain)  # full-training runs keep their old identity
