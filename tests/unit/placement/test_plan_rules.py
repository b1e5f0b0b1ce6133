"""What the plan checks besides grammar: engine rules, sizes from the run, fixes, cluster sizes."""

from __future__ import annotations

import json

import pytest
from model_configs import QWEN25_05B
from placement_helpers import CONF, compose

from rltrain.config.schema import ModelConfig, OffloadPolicyConfig, RunConfig
from rltrain.errors import ConfigError, PlacementError, ResourceError
from rltrain.placement import PlacementMode
from rltrain.placement import memory as mem
from rltrain.placement.export import plan_to_dict
from rltrain.placement.micro_batches import choose_micro_batches
from rltrain.placement.plan import build_plan, component_terms, micro_batch
from rltrain.placement.types import GIB, ClusterSpec

MID = ModelConfig(
    hidden_size=1024,
    intermediate_size=4096,
    num_layers=8,
    num_heads=8,
    num_kv_heads=8,
    max_position_embeddings=128,
    dtype="bfloat16",
)
W = 268_601_344  # MID's weights in bf16 (test_memory.MID_PARAMS * 2)


def plan_of(run: RunConfig, check_fit: bool = True):
    return build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=check_fit)


def run_on(placement: dict, cuda: bool = False) -> RunConfig:
    run = RunConfig()
    run.cluster.devices_per_node = 4
    run.cluster.device_memory_gib = 16.0
    run.cluster.simulate_devices = not cuda
    run.placement.component_placement = placement
    return run


# ------------------------------------------------------------------------ engine rules
def test_nccl_groups_never_put_two_ranks_on_one_gpu():
    layout = {"actor": "0-1:0-3", "rollout": "2-3"}
    with pytest.raises(PlacementError) as err:
        plan_of(run_on(layout, cuda=True))
    msg = str(err.value)
    assert (
        "placement.component_placement['actor']='0-1:0-3': actor ranks 0 and 1 share GPU 0" in msg
    )
    assert "one NCCL process group" in msg and "cluster.simulate_devices=true" in msg
    # Simulated devices run gloo, which allows it; the critic is a group of its own too.
    assert plan_of(run_on(layout)).world_size("actor") == 4
    with pytest.raises(PlacementError, match="critic ranks 0 and 1 share GPU 3"):
        plan_of(run_on({"actor": "0-1", "rollout": "2", "critic": "3:0-1"}, cuda=True))


def test_plan_on_cluster_ray_refuses_what_the_gpus_would():
    # cluster=ray plans real GPUs (simulate_devices: false): the shipped collocated layout
    # widened to two actor ranks per device is refused before any process starts.
    over = {"placement.component_placement.actor": "0-3:0-7", "placement.fuse": "false"}
    with pytest.raises(PlacementError, match="actor ranks 0 and 1 share GPU 0"):
        plan_of(compose("collocated", cluster="ray", **over))
    assert plan_of(compose("collocated", **{**over, "cluster.devices_per_node": 4}))


def test_weight_sync_ipc_needs_an_actor_rank_on_every_rollout_gpu():
    partial = run_on({"actor": "0-1", "rollout": "1-2"}, cuda=True)
    partial.weight_sync.transport = "ipc"
    with pytest.raises(ConfigError) as err:
        plan_of(partial)
    msg = str(err.value)
    assert "weight_sync.transport=ipc" in msg and "rollout rank 1 uses device 2 of node 0" in msg
    assert "use weight_sync.transport=host, collective or auto" in msg
    for transport in ("host", "collective", "auto"):
        partial.weight_sync.transport = transport
        assert plan_of(partial).mode is PlacementMode.HYBRID  # served: accepted
    inside = run_on({"actor": "0-3", "rollout": "2-3"}, cuda=True)
    inside.weight_sync.transport = "ipc"
    assert plan_of(inside).weight_sync == {0: (), 1: (), 2: (0,), 3: (1,)}


# -------------------------------------------------------------- sizes from what the run sees
def mid_terms(run: RunConfig, name: str, world: int) -> dict[str, int]:
    node = ClusterSpec.from_config(run.cluster).nodes[0]
    return component_terms(run, name, world, 1, node, mem.model_dims(run.model))


def test_activations_and_kv_follow_prompt_and_response_lengths():
    run = run_on({"actor,rollout": "0-1"})
    run.model = MID
    run.task.max_prompt_length, run.rollout.max_new_tokens = 20, 12  # 32 tokens
    # b*s*h = 64*32*1024 = 2_097_152; *8 layers*17*2 bytes + logits of the 12 response
    # tokens, 5 fp32 copies: 64*12*32*4*5
    assert mid_terms(run, "actor", 2)["activations"] == 570_425_344 + 491_520
    # the torch rollout: ceil(8*16/2) = 64 sequences x 32 tokens x 32_768 bytes per token
    assert mid_terms(run, "rollout", 2)["kv_cache"] == 67_108_864
    run.actor.gradient_checkpointing = True  # layer inputs (8) + one layer recomputed (17)
    assert mid_terms(run, "actor", 2)["activations"] == 2_097_152 * 25 * 2 + 491_520
    run.algorithm.entropy_coef = 0.01  # an entropy bonus keeps a sixth copy
    assert mid_terms(run, "actor", 2)["activations"] == 2_097_152 * 25 * 2 + 64 * 12 * 32 * 4 * 6


def test_a_micro_batch_holds_no_more_rows_than_a_rank_gets():
    run = run_on({"actor,rollout": "0-1"})
    run.model = MID
    run.task.max_prompt_length, run.rollout.max_new_tokens = 20, 12
    run.trainer.train_batch_size, run.rollout.n_samples_per_prompt = 2, 4
    assert micro_batch(run, 64, 2) == 4  # ceil(2*4/2) rows per rank
    # b*s*h = 4*32*1024 = 131_072 -> *136*2 + logits 4*12*32*4*5
    assert mid_terms(run, "actor", 2)["activations"] == 35_651_584 + 30_720
    run.algorithm.num_minibatches = 2
    assert micro_batch(run, 64, 2) == 2
    run.runner = "embodied"  # its actor batches transitions, not prompts: the setting rules
    assert micro_batch(run, 64, 2) == 64


def test_a_reward_model_is_counted_as_a_sequence_classifier(tmp_path):
    # A Qwen-shaped reward checkpoint, embeddings untied: the worker loads it with
    # AutoModelForSequenceClassification, a one-score head in place of the LM head.
    shape = {**QWEN25_05B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    shape.update(num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    shape.update(max_position_embeddings=128, tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(shape))
    run = run_on({"actor,rollout": "0-1"})
    run.model = MID
    run.task.max_prompt_length, run.rollout.max_new_tokens = 20, 12  # 32 tokens
    run.reward.kind, run.reward.model_path, run.reward.micro_batch_size = "model", str(tmp_path), 8
    terms = mid_terms(run, "reward", 2)
    # per layer 64*(64+64) + 64*64 + 3*64*128 + 2*64 + (64+64) q/k/v biases = 37_120; embeddings
    # 1000*64, final norm 64, score head 64 (no LM head): 138_368 parameters in bf16
    assert terms["weights"] == 138_368 * 2
    # a forward of 8 sequences of 32 tokens: 8*32*64*17 elements in bf16, one fp32 score a token
    assert terms["activations"] == 8 * 32 * 64 * 17 * 2 + 8 * 32 * 4
    # saved in float32: the worker loads it so (transformers' dtype "auto"), and so it counts
    (tmp_path / "config.json").write_text(json.dumps({**shape, "dtype": "float32"}))
    assert mid_terms(run, "reward", 2)["weights"] == 138_368 * 4


def write_qwen(tmp_path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_05B))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("dtype", "rows", "peak_gib"), [("float32", 64, 54.9), ("bfloat16", 128, 54.7)]
)
def test_qwen25_05b_plans_on_one_80_gib_device(tmp_path, dtype, rows, peak_gib):
    # The figures docs/placement.md (Memory model) quotes: keep them in step.
    run = compose(
        "collocated",
        **{
            "model.path": write_qwen(tmp_path),
            "model.dtype": dtype,
            "cluster.devices_per_node": 1,
            "cluster.device_memory_gib": 80,
        },
    )
    run, choice = choose_micro_batches(run)  # as mode=plan: the largest micro-batch that fits
    assert choice.chosen["actor.micro_batch_size"] == rows  # float32: 128 rows do not fit
    plan = plan_of(run)  # fits: no ResourceError
    train = plan.memory[(0, 0)].stage("train")
    act = next(t.bytes for t in train.terms if t.kind == "activations")
    # `rows` sequences of 512 + 4 tokens (not the checkpoint's 32,768): b*s*h*L*17 elements in
    # the model dtype plus 5 fp32 copies of the 4 response tokens' logits over the
    # 151,936-token vocabulary.
    elements = rows * 516 * 896 * 24 * 17
    assert act == elements * mem.DTYPE_BYTES[dtype] + rows * 4 * 151_936 * 4 * 5
    assert round(plan.memory[(0, 0)].peak_bytes / GIB, 2) == peak_gib
    doc = " ".join((CONF.parent / "docs" / "placement.md").read_text().split())
    assert f"{rows} rows at {peak_gib} GiB in {dtype}" in doc


def test_fixes_never_suggest_a_setting_already_on(tmp_path):
    over = {
        "model.path": write_qwen(tmp_path),
        "cluster.devices_per_node": 1,
        "cluster.device_memory_gib": 24,
    }
    fixes = plan_of(compose("collocated", **over), check_fit=False).fit_problems()[0].fixes
    text = " ".join(fixes)
    assert "lower actor.micro_batch_size (now 64) or enable actor.gradient_checkpointing" in text
    run = compose(
        "collocated",
        **over,
        **{"actor.gradient_checkpointing": True, "actor.micro_batch_size": 1},
    )
    run.cluster.device_memory_gib = 4
    text = " ".join(plan_of(run, check_fit=False).fit_problems()[0].fixes)
    assert "gradient_checkpointing" not in text and "micro_batch_size" not in text
    assert "task.max_prompt_length (now 512)" in text


def test_offload_fix_adds_to_the_states_the_policy_already_moves():
    run = run_on({"actor,rollout": "0-1"}, cuda=True)
    run.model = MID
    run.rollout.backend = "vllm"
    run.rollout.gpu_memory_utilization = 0.8
    run.placement.offload = {
        "rollout": OffloadPolicyConfig(when="on_demand", states=["weights"]),
    }
    (problem,) = plan_of(run, check_fit=False).fit_problems()
    assert (
        "placement.offload.rollout={when: on_demand, states: [kv_cache, weights]}"
        in problem.fixes[0]
    )


def test_vllm_engine_without_room_for_one_sequence_is_refused():
    run = run_on({"actor,rollout": "0-1"}, cuda=True)
    run.model = MID  # 128 positions: 516 tokens asked, 128 taken
    run.rollout.backend = "vllm"
    # floor(0.0157 * 16 GiB) = 269_723_946 reserved - W = 1_122_602 bytes: 34 tokens
    run.rollout.gpu_memory_utilization = 0.0157
    plan = plan_of(run, check_fit=False)
    assert plan.fit_problems() == []
    with pytest.raises(ResourceError, match="room for 34 tokens, fewer than one sequence of 128"):
        plan.check_fit()
    assert plan_to_dict(plan)["fits"] is False
    run.rollout.gpu_memory_utilization = 0.5
    run.rollout.max_model_len = 64
    assert plan_of(run).engine_problems == ()


# --------------------------------------------------------------------------- cluster sizes
@pytest.mark.parametrize(
    ("cluster", "needle"),
    [
        ({"num_nodes": 1, "devices_per_node": 1e8}, "100,000,000 devices, beyond any real"),
        ({"num_nodes": 10**12, "devices_per_node": 8}, "cluster.num_nodes=1,000,000,000,000"),
        ({"num_nodes": 12_501, "devices_per_node": 8}, "100,008 devices"),
        ({"num_nodes": 2, "devices_per_node": [8, 1e9]}, "1,000,000,008 devices"),
        ({"num_nodes": 1, "devices_per_node": 2.5}, "devices_per_node=2.5 is not a whole"),
        ({"num_nodes": 0}, "cluster.num_nodes=0 is not a whole number >= 1"),
        ({"device_memory_gib": float("nan")}, "device_memory_gib=nan is not a device memory"),
        ({"device_memory_gib": -1}, "device_memory_gib=-1"),
    ],
)
def test_sizes_beyond_any_real_cluster_are_refused_at_once(cluster, needle):
    # Refused from the sizes alone: nothing per node or device is built first (10^12 nodes
    # could not be).
    with pytest.raises(ConfigError) as err:
        ClusterSpec.from_config(cluster)
    assert needle in str(err.value)


def test_the_largest_allowed_cluster_is_still_built():
    spec = ClusterSpec.from_config({"num_nodes": 12_500, "devices_per_node": 8})
    assert spec.num_devices == 100_000


def test_torch_kv_cache_is_not_held_while_the_rollout_is_idle():
    # The torch engine frees its KV cache after generating, so an idle rollout whose policy
    # moves only its weights holds nothing on the actor's device: device 1 (actor + rollout)
    # trains in what device 0 (actor alone) needs; counting 8 MiB of idle KV cache refused this
    # plan and suggested offloading the cache, which changes nothing at run time.
    run = compose(
        "hybrid",
        **{
            "placement.offload.rollout.states": "[weights]",
            "cluster.device_memory_gib": 0.04,
            "actor.micro_batch_size": 64,
        },
    )
    plan = plan_of(run)  # fits: no ResourceError
    alone, shared = plan.memory[(0, 0)].stage("train"), plan.memory[(0, 1)].stage("train")
    assert [(t.kind, t.status) for t in shared.terms if t.component == "rollout"] == [
        ("weights", "offloaded")
    ]
    assert shared.required_bytes == alone.required_bytes
    kv = next(t for t in plan.memory[(0, 1)].stage("generate").terms if t.kind == "kv_cache")
    assert (kv.component, kv.bytes, kv.status) == ("rollout", 128 * 64 * 1024, "active")


def test_the_shorten_fix_says_when_the_models_positions_cap_the_sequences():
    # tiny llama: 64 positions; 512 + 4 tokens are capped to 64, so lowering the prompt length
    # alone changes nothing until the sum is below 64
    run = compose("collocated", **{"cluster.device_memory_gib": 0.001})
    text = " ".join(plan_of(run, check_fit=False).fit_problems()[0].fixes)
    assert (
        "task.max_prompt_length=512 + rollout.max_new_tokens=4 exceed the model's 64 positions "
        "(model.max_position_embeddings), which bound them: bring the sum below 64"
    ) in text
    assert "task.max_prompt_length (now" not in text
    run = compose(
        "collocated", **{"cluster.device_memory_gib": 0.001, "task.max_prompt_length": 20}
    )
    text = " ".join(plan_of(run, check_fit=False).fit_problems()[0].fixes)
    assert "task.max_prompt_length (now 20) or rollout.max_new_tokens (now 4)" in text
