"""build_plan: processes, sharing, mode checks and the memory prediction, by hand."""

from __future__ import annotations

import json

import pytest
from placement_helpers import compose, make_cluster

from rltrain.config.schema import ModelConfig, OffloadPolicyConfig, RunConfig
from rltrain.errors import PlacementError, ResourceError
from rltrain.placement import PlacementMode
from rltrain.placement.export import plan_to_dict
from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec

GIB = 1024**3


@pytest.mark.parametrize("placement", ["collocated", "disaggregated", "hybrid"])
@pytest.mark.parametrize("devices", [2, 8])
def test_shipped_placements_plan(placement: str, devices: int):
    run = compose(placement, **{"cluster.devices_per_node": devices})
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert plan.mode is PlacementMode(placement)  # placement.mode is checked against the layout
    assert plan.components == ("actor", "rollout", "reward")
    assert plan.placements("reward")[0].device_ids == ()
    json.dumps(plan_to_dict(plan))


def test_shipped_collocated_on_local_by_hand():
    run = compose("collocated")
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert [(p.component, p.rank, p.node_rank, p.devices) for p in plan.processes] == [
        ("actor", 0, 0, (0,)),
        ("actor", 1, 0, (1,)),
        ("rollout", 0, 0, (0,)),
        ("rollout", 1, 0, (1,)),
        ("reward", 0, 0, ()),
    ]
    assert dict(plan.sharing) == {(0, 0): ("actor", "rollout"), (0, 1): ("actor", "rollout")}
    assert plan.devices_used() == frozenset({(0, 0), (0, 1)})
    assert plan.world_size("rollout") == 2
    assert plan.stages == ("generate", "train", "sync")  # no reward model, no logprob stage
    assert dict(plan.weight_sync) == {0: (0,), 1: (1,)}
    with pytest.raises(PlacementError, match="'critic' is not in the plan"):
        plan.world_size("critic")


def test_hybrid_shares_only_the_rollout_device():
    run = compose("hybrid", **{"cluster.devices_per_node": 8})
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert plan.sharing[(0, 1)] == ("actor", "rollout")
    assert plan.sharing[(0, 0)] == ("actor",)


def test_mode_contradicting_the_layout_is_refused():
    run = compose("hybrid")
    run.placement.mode = "collocated"
    with pytest.raises(
        PlacementError, match="placement.mode='collocated'.*'hybrid'.*placement.mode=hybrid"
    ):
        build_plan(run, ClusterSpec.from_config(run.cluster))


def test_placement_auto_plans_the_layout_it_profiles_first():
    # auto is no layout to check against: the config's (every device, taking turns) is the
    # first one profiled, and the winner is concrete. A sweep's launcher plans it this way.
    run = compose("auto")
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert plan.mode is PlacementMode.COLLOCATED
    assert plan.devices_used() == frozenset({(0, 0), (0, 1)})


def test_a_sweeps_auto_job_reserves_every_device_and_is_labelled_auto():
    from omegaconf import OmegaConf

    from hydra_plugins.rltrain_launcher._plan import job_needs
    from rltrain.config.store import register_configs

    register_configs()
    for mode in ("train", "plan"):
        needs = job_needs(OmegaConf.structured(compose("auto", mode=mode)))
        assert needs.error is None, needs.error
        assert needs.placement_mode == "auto"
        assert needs.devices == (frozenset({(0, 0), (0, 1)}) if mode == "train" else frozenset())
    # The config's layout is only the first one profiled: a narrower one still reserves every
    # device auto chooses over.
    run = compose(
        "auto",
        **{"cluster.devices_per_node": 4, "placement.component_placement.actor": "0-1"},
    )
    needs = job_needs(OmegaConf.structured(run))
    assert needs.error is None, needs.error
    assert needs.devices == frozenset((0, d) for d in range(4))


def test_large_cluster_plan():
    run = compose("collocated", **{"cluster.num_nodes": 128, "cluster.devices_per_node": 8})
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert plan.world_size("actor") == 1024 and len(plan.devices_used()) == 1024
    assert plan.placements("rollout")[1023].cluster_node_rank == 127


# ------------------------------------------------------------------ the memory model, by hand
def mid_run(**offload: OffloadPolicyConfig) -> RunConfig:
    """Collocated actor+rollout on 1 node x 2 cuda devices of 16 GiB, a 134M-parameter bf16
    model (test_memory.MID), vLLM rollout at 0.5 utilisation."""
    run = RunConfig()
    run.cluster.devices_per_node = 2
    run.cluster.device_memory_gib = 16.0
    run.cluster.simulate_devices = False
    run.model = ModelConfig(
        hidden_size=1024,
        intermediate_size=4096,
        num_layers=8,
        num_heads=8,
        num_kv_heads=8,
        max_position_embeddings=128,
        dtype="bfloat16",
    )
    run.rollout.backend = "vllm"
    run.rollout.gpu_memory_utilization = 0.5
    run.placement.component_placement = {"actor,rollout": "all"}
    run.placement.offload = dict(offload)
    return run


W = 268_601_344  # 134_300_672 params * 2 bytes (weights; grads the same)
OPT = 1_611_608_064  # params * 12 (two fp32 moments + fp32 master)
ACT = 2_281_865_216  # 64*128*1024*8*17*2 + logits of 4 response tokens x 5 copies 64*4*32*4*5
CTX = 512 * 1024**2
KV = 8 * GIB - W  # floor(0.5 * 16 GiB) reserved by vLLM, minus its weights

AFTER = OffloadPolicyConfig(when="after_stage", states=["weights", "grads", "optimizer"])
ROLL_AFTER = OffloadPolicyConfig(when="after_stage", states=["weights", "kv_cache"])


def terms(stage) -> dict[tuple[str, str], tuple[int, str]]:
    return {(t.component, t.kind): (t.bytes, t.status) for t in stage.terms}


def test_memory_with_after_stage_offload():
    run = mid_run(actor=AFTER, rollout=ROLL_AFTER)
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    dm = plan.memory[(0, 0)]
    assert plan.memory[(0, 1)] is dm  # identical devices share one record
    gen, train, sync = (dm.stage(s) for s in ("generate", "train", "sync"))
    assert terms(gen) == {
        ("actor", "weights"): (W, "offloaded"),
        ("actor", "grads"): (W, "offloaded"),
        ("actor", "optimizer"): (OPT, "offloaded"),
        ("actor", "context"): (CTX, "pinned"),
        ("rollout", "weights"): (W, "active"),
        ("rollout", "kv_cache"): (KV, "active"),
        ("rollout", "context"): (CTX, "active"),
    }
    assert gen.required_bytes == gen.peak_bytes == 9 * GIB  # 8 GiB vLLM + 2 contexts
    assert train.required_bytes == W + W + OPT + ACT + CTX + CTX == 5_504_417_792
    # the actor's CUDA-IPC buckets (a packed copy of its weights) from its export until the
    # rollout has loaded them: the sync stage only, beside both copies of the weights
    assert terms(sync)[("actor", "weight_sync")] == (W, "active")
    assert sync.required_bytes == W + W + CTX + W + CTX == 1_879_545_856
    assert ("actor", "weight_sync") not in terms(gen) | terms(train)
    assert dm.peak_bytes == 9 * GIB


def test_ipc_export_buckets_are_planned_only_where_ipc_may_run():
    run = mid_run(actor=AFTER, rollout=ROLL_AFTER)
    run.weight_sync.transport = "host"  # the object store: no device buckets
    sync = build_plan(run, ClusterSpec.from_config(run.cluster)).memory[(0, 0)].stage("sync")
    assert ("actor", "weight_sync") not in terms(sync)
    run = mid_run(actor=AFTER, rollout=ROLL_AFTER)
    run.cluster.simulate_devices = True  # simulated devices: no CUDA, no IPC
    sync = build_plan(run, ClusterSpec.from_config(run.cluster)).memory[(0, 0)].stage("sync")
    assert ("actor", "weight_sync") not in terms(sync)


def test_an_nccl_broadcast_snapshot_is_planned_on_the_actor_gpu():
    # Disaggregated on CUDA: the actor's GPU holds the one snapshot a collective (NCCL) sender
    # keeps on the device while it broadcasts, W = 134_300_672 params * 2 bytes (bf16), in the
    # sync stage beside the actor's own weights; the rollout's GPU holds none.
    for transport in ("collective", "auto"):
        run = mid_run(actor=AFTER, rollout=ROLL_AFTER)
        run.placement.component_placement = {"actor": "0", "rollout": "1"}
        run.weight_sync.transport = transport
        plan = build_plan(run, ClusterSpec.from_config(run.cluster))
        actor_sync = terms(plan.memory[(0, 0)].stage("sync"))
        assert actor_sync[("actor", "weight_sync")] == (W, "active") == (268_601_344, "active")
        assert actor_sync[("actor", "weights")] == (W, "active")
        assert ("actor", "weight_sync") not in terms(plan.memory[(0, 0)].stage("train"))
        assert ("actor", "weight_sync") not in terms(plan.memory[(0, 1)].stage("sync"))
    # Asynchronous: the actor trains while its last export still waits for the rollout's next
    # generation, so the snapshot counts in its train stage too.
    run = mid_run(actor=AFTER, rollout=ROLL_AFTER)
    run.placement.component_placement = {"actor": "0", "rollout": "1"}
    run.weight_sync.transport = "collective"
    run.trainer.max_staleness = 1
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert terms(plan.memory[(0, 0)].stage("train"))[("actor", "weight_sync")] == (W, "active")
    # The object store, or gloo on simulated devices: the snapshot is host memory.
    for transport, simulated in (("host", False), ("collective", True)):
        run = mid_run(actor=AFTER, rollout=ROLL_AFTER)
        run.placement.component_placement = {"actor": "0", "rollout": "1"}
        run.weight_sync.transport = transport
        run.cluster.simulate_devices = simulated
        sync = build_plan(run, ClusterSpec.from_config(run.cluster)).memory[(0, 0)].stage("sync")
        assert ("actor", "weight_sync") not in terms(sync)


def test_memory_without_offload_keeps_idle_state_resident():
    run = mid_run()
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    train = plan.memory[(0, 0)].stage("train")
    assert terms(train)[("rollout", "kv_cache")] == (KV, "pinned")
    assert train.required_bytes == (W + W + OPT + ACT + CTX) + (W + KV + CTX) == 14_094_352_384


def test_zero3_shards_every_state_over_data_parallel_ranks():
    run = mid_run(actor=AFTER, rollout=ROLL_AFTER)
    run.actor.backend = "deepspeed"
    run.actor.zero_stage = 3
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    t = terms(plan.memory[(0, 0)].stage("train"))
    assert t[("actor", "weights")][0] == W // 2
    assert t[("actor", "grads")][0] == W // 2
    assert t[("actor", "optimizer")][0] == OPT // 2


def test_on_demand_state_is_evicted_only_when_the_room_is_needed():
    on_demand = OffloadPolicyConfig(when="on_demand", states=["weights", "grads", "optimizer"])
    run = mid_run(actor=on_demand)
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    gen = plan.memory[(0, 0)].stage("generate")
    assert terms(gen)[("actor", "optimizer")] == (OPT, "evictable")
    assert gen.peak_bytes == gen.required_bytes + W + W + OPT  # room enough: stays resident
    run.rollout.gpu_memory_utilization = 0.85  # floor(0.85 * 16 GiB) = 14_602_888_806
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    gen = plan.memory[(0, 0)].stage("generate")
    assert gen.required_bytes == 14_602_888_806 + 2 * CTX
    assert terms(gen)[("actor", "optimizer")] == (OPT, "offloaded")
    # one kind at a time, the largest first (the runtime's rule): the optimizer's leaving makes
    # the room, so the weights and grads stay
    assert gen.peak_bytes == gen.required_bytes + W + W


def test_simulated_devices_have_no_context_and_torch_rollout_has_a_kv_estimate():
    run = mid_run()
    run.cluster.simulate_devices = True
    run.rollout.backend = "torch"
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    t = terms(plan.memory[(0, 0)].stage("generate"))
    assert ("rollout", "context") not in t
    # ceil(8 prompts * 16 samples / 2 processes) = 64 sequences of 128 tokens
    assert t[("rollout", "kv_cache")] == (268_435_456, "active")


def test_plan_that_cannot_fit_is_refused_with_device_shortfall_and_fix():
    run = mid_run()
    run.rollout.gpu_memory_utilization = 0.8
    with pytest.raises(ResourceError) as err:
        build_plan(run, ClusterSpec.from_config(run.cluster))
    msg = str(err.value)
    # train: actor 4_968_431_616 + idle rollout (W + floor(0.8*16 GiB) - W + CTX) = 19_248_313_139
    assert "device 0 of node 0 (and 1 more devices like it)" in msg
    assert "needs 17.93 GiB in stage 'train', capacity 16.00 GiB, short by 1.93 GiB" in msg
    assert "placement.offload.rollout={when: after_stage, states: [kv_cache, weights]}" in msg
    assert "rollout.gpu_memory_utilization" in msg


def test_plan_refusing_to_fit_can_still_be_inspected():
    run = mid_run()
    run.rollout.gpu_memory_utilization = 0.8
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    (problem,) = plan.fit_problems()
    assert problem.devices == ((0, 0), (0, 1))
    assert problem.shortfall_bytes == 19_248_313_139 - 16 * GIB
    data = plan_to_dict(plan)
    assert data["fits"] is False and "short by" in data["problems"][0]


def test_processes_sharing_a_device_add_up():
    run = mid_run(actor=AFTER, rollout=ROLL_AFTER)
    run.rollout.backend = "torch"
    # Two rollout processes per GPU (not an NCCL group: allowed on CUDA devices).
    run.placement.component_placement = {"actor": "0-1", "rollout": "0-1:0-3"}
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    t = terms(plan.memory[(0, 0)].stage("generate"))
    assert t[("rollout", "weights")][0] == 2 * W  # two rollout processes on device 0
    assert t[("rollout", "context")][0] == 2 * CTX
    # The same sharing for the actor is refused on GPUs (one NCCL group), allowed simulated.
    run.placement.component_placement = {"actor": "0-1:0-3", "rollout": "0-1"}
    with pytest.raises(PlacementError, match="actor ranks 0 and 1 share GPU 0 of node 0"):
        build_plan(run, ClusterSpec.from_config(run.cluster))
    run.cluster.simulate_devices = True
    t = terms(build_plan(run, ClusterSpec.from_config(run.cluster)).memory[(0, 0)].stage("train"))
    assert t[("actor", "weights")][0] == 2 * W


def test_to_dict_round_trips_through_json():
    run = compose("hybrid", **{"cluster.devices_per_node": 8})
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    data = json.loads(json.dumps(plan_to_dict(plan)))
    assert data["mode"] == "hybrid"
    assert {c["name"]: c["world_size"] for c in data["components"]} == {
        "actor": 8,
        "rollout": 1,
        "reward": 1,
    }
    assert len(data["processes"]) == 10
    dev1 = next(d for d in data["devices"] if d["device"] == 1)
    assert dev1["components"] == ["actor", "rollout"]
    profile = data["memory_profiles"][dev1["memory_profile"]]
    assert profile["capacity_bytes"] == 4 * GIB
    assert data["weight_sync"]["1"] == [0]


def test_node_only_cluster_uses_node_ranks():
    run = RunConfig()
    run.runner = "embodied"
    run.placement.component_placement = {"env": "0-1:0-3", "actor": "0"}
    plan = build_plan(run, make_cluster([0, 0]))
    assert [p.cluster_node_rank for p in plan.placements("env")] == [0, 0, 1, 1]
    assert plan.devices_used() == frozenset() and plan.stages == ()
