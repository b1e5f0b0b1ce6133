"""The residency ledger as the job builds it (each worker's measured state plus the plan's
transient terms) against the plan it was built from: every byte counted once (no Ray, no vLLM)."""

from __future__ import annotations

from composed import composed_run

from rltrain.backends.generation import VllmState
from rltrain.config import resolve_offload
from rltrain.placement.plan import build_plan
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec
from rltrain.runners.job import _planned_state, _stage_extra
from rltrain.scheduler.residency import ResidencyCoordinator, Resident
from rltrain.workers.common import ResidentState

DEV = (0, 0)
CAPACITY = 80 * GIB
RESERVED = 51_539_607_552  # floor(0.6 * 80 GiB): what the engine reserves


class AwakeEngine:
    """A vLLM engine as VllmRollout starts it: awake, weights and KV cache on the GPU."""

    asleep = False
    weights_asleep = False

    def sleep(self) -> None:
        self.asleep = self.weights_asleep = True

    def wake_weights(self) -> None:
        self.weights_asleep = False


class Worker(ResidentState):
    def __init__(self, mover) -> None:
        self.mover = mover


def one_device_plan(*overrides: str):
    run = composed_run("placement=collocated", "placement.fuse=false", *overrides)
    cluster = ClusterSpec((NodeSpec(0, 1, CAPACITY, "sim"),))
    return run, build_plan(run, cluster)


def term(plan, stage: str, component: str, kind: str) -> int:
    return next(
        t.bytes
        for t in plan.memory[DEV].stage(stage).terms
        if t.component == component and t.kind == kind
    )


def register(co, run, plan, component: str, total: dict[str, int]) -> None:
    policy = resolve_offload(run.placement.offload.get(component), component)
    extra = _stage_extra(plan, component, DEV)
    co.register(Resident(component, 0, (DEV,), policy, total, stage_extra=extra))


def test_vllm_kv_cache_is_counted_once_so_a_plan_that_fits_gets_its_lease():
    run, plan = one_device_plan(
        "rollout.backend=vllm", "cluster=ray", "rollout.gpu_memory_utilization=0.6"
    )
    weights = term(plan, "generate", "rollout", "weights")
    kv = RESERVED - weights
    assert term(plan, "generate", "rollout", "kv_cache") == kv
    rollout = Worker(VllmState(AwakeEngine(), weights, kv))
    assert rollout.state_bytes() == {"weights": weights, "kv_cache": kv}  # measured: state
    actor = {k: term(plan, "train", "actor", k) for k in ("weights", "grads", "optimizer")}
    co = ResidencyCoordinator({DEV: CAPACITY})
    register(co, run, plan, "actor", actor)
    register(co, run, plan, "rollout", rollout.state_bytes())
    with co.stage("rollout") as lease:  # counting the cache twice needed 96 GiB: refused
        assert lease.evictions == ()  # 48 GiB and a tiny actor fit 80 GiB
        assert co.usage(DEV) == RESERVED + sum(actor.values())
    assert _stage_extra(plan, "rollout", DEV) == 0  # the plan's kv_cache is not added again


def test_torch_kv_cache_is_a_transient_term_of_the_lease():
    run, plan = one_device_plan()
    kv = term(plan, "generate", "rollout", "kv_cache")
    # ceil(8 prompts * 16 samples / 1 process) = 128 sequences of 512 + 4 tokens capped at the
    # model's 64 positions; K and V of 2 layers, kv_dim 64, float32: 128 * 64 * 2 * 2 * 64 * 4
    assert kv == 128 * 64 * 2 * 2 * 64 * 4
    assert _stage_extra(plan, "rollout", DEV) == kv  # the engine's mover does not hold it
    train = {t.kind for t in plan.memory[DEV].stage("train").terms if t.component == "rollout"}
    assert "kv_cache" not in train  # freed after generating: not held while the actor trains


def test_two_processes_on_one_device_share_its_transient_term_and_get_their_lease():
    # The actor's two processes on the one device: the plan's activations term is the device's
    # total, so each process's lease adds half of it, and a device of exactly the plan's
    # largest stage peak grants the actor's lease (it was refused: each counted the total).
    overrides = ("cluster.devices_per_node=1", "placement.component_placement.actor=0:0-1")
    run, roomy = one_device_plan(*overrides)
    need = max(s.peak_bytes for s in roomy.memory[DEV].stages)
    run = composed_run("placement=collocated", "placement.fuse=false", *overrides)
    plan = build_plan(run, ClusterSpec((NodeSpec(0, 1, need, "sim"),)))
    assert plan.fit_problems() == []
    activations = term(plan, "train", "actor", "activations")
    assert _stage_extra(plan, "actor", DEV) == -(-activations // 2)
    co = ResidencyCoordinator({DEV: need})
    for comp, procs in plan.by_component.items():
        policy = resolve_offload(run.placement.offload.get(comp), comp)
        for p in procs:
            state = _planned_state(plan, comp, (DEV,), ("weights", "grads", "optimizer"))
            extra = _stage_extra(plan, comp, DEV)
            co.register(Resident(comp, p.rank, (DEV,), policy, state, stage_extra=extra))
    co.plan_stage("actor")  # granted: no ResourceError
