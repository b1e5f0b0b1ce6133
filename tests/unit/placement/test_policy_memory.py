"""The embodied runner's memory: its actor-critic MLP, sized from the environment's spaces, by
hand (not the language-model formulas: no vocabulary, no sequences, no KV cache)."""

from __future__ import annotations

import pytest
from composed import composed_run

from rltrain.errors import ResourceError
from rltrain.placement import memory as mem
from rltrain.placement.plan import build_plan, component_terms, policy_dims
from rltrain.placement.types import ClusterSpec

# CartPole-v1: 4 observations, 2 discrete actions; the presets' MLPs: 2 tanh layers of 64.
CARTPOLE = mem.PolicyDims(obs_dim=4, action_dim=2, continuous=False, hidden=64, layers=2)


def test_actor_critic_parameters_by_hand():
    # policy: (4*64 + 64) + (64*64 + 64) + (64*2 + 2) = 320 + 4160 + 130 = 4610
    # value:   320 + 4160 + (64*1 + 1)                                    = 4545
    assert mem.policy_param_count(CARTPOLE) == 9155
    # continuous, one hidden layer: (3*8 + 8) + (8*1 + 1) = 41 per MLP, plus log_std (1)
    assert mem.policy_param_count(mem.PolicyDims(3, 1, True, 8, 1)) == 83
    # no hidden layer: a linear head per MLP, 4*2 + 2 and 4*1 + 1
    assert mem.policy_param_count(mem.PolicyDims(4, 2, False, 64, 0)) == 15


def test_the_count_is_the_workers_network():
    torch = pytest.importorskip("torch")
    from rltrain.workers.embodied import ActorCritic
    from rltrain.workers.env import SpaceSpec

    for dims, kind in ((CARTPOLE, "discrete"), (mem.PolicyDims(3, 1, True, 8, 1), "continuous")):
        spec = SpaceSpec("x", dims.obs_dim, kind, dims.action_dim)
        with torch.random.fork_rng(devices=[]):
            net = ActorCritic(spec, dims.hidden, dims.layers)
        assert sum(p.numel() for p in net.parameters()) == mem.policy_param_count(dims)


def test_cartpole_hybrid_terms_by_hand():
    run = composed_run("experiment=cartpole_hybrid")
    assert policy_dims(run) == CARTPOLE  # read from gymnasium's CartPole-v1 spaces
    node = ClusterSpec.from_config(run.cluster).nodes[0]
    dims = mem.model_dims(run.model)
    # actor (2 processes): float32 weights 9155*4, gradients 9155*4, AdamW moments 9155*8;
    # activations: the epoch's 16 envs x 64 steps = 1024 transitions x (2*4 obs + 1 action
    # + 7 scalars) = 16,384 floats, and a minibatch of 1024 / 4 minibatches / 2 ranks = 128
    # rows x (4*2*64 + 2 + 1) = 65,920 floats: 82,304 floats = 329,216 B
    assert component_terms(run, "actor", 2, 1, node, dims) == {
        "weights": 36_620,
        "grads": 36_620,
        "optimizer": 73_240,
        "activations": 329_216,
    }
    # rollout: a copy of the weights and one stage of 16 / 2 = 8 observations x (4 + 2*64 + 2)
    # floats = 4,288 B; no KV cache
    assert component_terms(run, "rollout", 1, 1, node, dims) == {
        "weights": 36_620,
        "activations": 4_288,
    }
    assert component_terms(run, "env", 1, 1, node, dims) == {}  # a CPU simulator


def test_an_embodied_fit_refusal_names_the_embodied_keys():
    run = composed_run("experiment=cartpole_hybrid", "cluster.device_memory_gib=0.0002")
    with pytest.raises(ResourceError) as err:
        build_plan(run, ClusterSpec.from_config(run.cluster))
    msg = str(err.value)
    assert "lower env.num_envs (now 16) or env.rollout_steps (now 64)" in msg
    assert "lower model.hidden_size (now 64) or model.num_layers (now 2)" in msg
    for language_key in (
        "max_prompt_length",
        "max_new_tokens",
        "gradient_checkpointing",
        "zero_stage",
        "micro_batch_size",
    ):
        assert language_key not in msg


def test_the_shipped_cartpole_preset_fits_a_small_device():
    # 0.02 GiB was refused when the plan sized a Llama here
    run = composed_run("experiment=cartpole_hybrid", "cluster.device_memory_gib=0.02")
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert max(dm.peak_bytes for dm in plan.memory.values()) < 1024**2
