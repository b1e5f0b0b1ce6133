"""One eviction rule for the plan and the residency coordinator, checked with hand values."""

from __future__ import annotations

from rltrain.config.offload import OffloadPolicy
from rltrain.placement import memory as mem
from rltrain.placement.plan import _stage_memory, evictions
from rltrain.scheduler.residency import ResidencyCoordinator, Resident

GIB = 1024**3
DEV = (0, 0)
ON_DEMAND = OffloadPolicy("on_demand", frozenset({"weights", "grads", "optimizer"}))
ACTOR = {"weights": GIB, "grads": GIB, "optimizer": 2 * GIB}  # 4 GiB
CRITIC = {"weights": 2 * GIB, "grads": 2 * GIB, "optimizer": GIB}  # 5 GiB
ROLLOUT = {"weights": GIB, "kv_cache": 3 * GIB}  # 4 GiB, generating


def test_most_movable_bytes_first_then_largest_kinds_only_as_far_as_needed():
    movable = {"actor": ACTOR, "critic": CRITIC}
    assert evictions(movable, 0) == []
    assert evictions(movable, 1) == [("critic", "grads", 2 * GIB)]  # ties by name
    assert evictions(movable, 3 * GIB) == [
        ("critic", "grads", 2 * GIB),
        ("critic", "weights", 2 * GIB),
    ]
    assert evictions(movable, 6 * GIB) == [
        ("critic", "grads", 2 * GIB),
        ("critic", "weights", 2 * GIB),
        ("critic", "optimizer", GIB),
        ("actor", "optimizer", 2 * GIB),
    ]
    assert evictions({"actor": {"weights": GIB, "optimizer": 0}}, 5 * GIB) == [
        ("actor", "weights", GIB)  # short of the room; a kind of 0 bytes never moves
    ]


def test_plan_and_coordinator_leave_the_same_state_on_the_device():
    # capacity 10 GiB, 4 + 5 + 4 = 13 GiB: 3 GiB short while the rollout generates
    capacity = 10 * GIB
    stage = _stage_memory(
        "generate",
        {"rollout": frozenset(mem.KINDS)},
        [("actor", 1, ACTOR), ("critic", 1, CRITIC), ("rollout", 1, ROLLOUT)],
        {"actor": ON_DEMAND, "critic": ON_DEMAND},
        capacity,
    )
    offloaded = {(t.component, t.kind) for t in stage.terms if t.status == "offloaded"}
    assert offloaded == {("critic", "grads"), ("critic", "weights")}
    assert stage.peak_bytes == 9 * GIB

    co = ResidencyCoordinator({DEV: capacity})
    co.register(Resident("actor", 0, (DEV,), ON_DEMAND, dict(ACTOR)))
    co.register(Resident("critic", 0, (DEV,), ON_DEMAND, dict(CRITIC)))
    co.register(Resident("rollout", 0, (DEV,), OffloadPolicy(), dict(ROLLOUT)))
    with co.stage("rollout") as lease:
        assert {(e.component, k) for e in lease.evictions for k in e.kinds} == offloaded
        assert co.usage(DEV) == stage.peak_bytes


def test_torch_kv_cache_is_transient_and_vllm_kv_cache_is_state():
    assert "kv_cache" in mem.transient_kinds(kv_reserved=False)
    assert "kv_cache" not in mem.transient_kinds(kv_reserved=True)
    assert set(mem.TRANSIENT_KINDS) <= set(mem.transient_kinds(kv_reserved=True))
    # idle rollout in the train stage: a reserved cache stays (pinned), the torch one is gone
    terms = [("actor", 1, ACTOR), ("rollout", 1, ROLLOUT)]
    for kv_reserved, expect in ((True, {"weights", "kv_cache"}), (False, {"weights"})):
        stage = _stage_memory(
            "train",
            {"actor": frozenset(mem.KINDS)},
            terms,
            {},
            16 * GIB,
            frozenset(mem.transient_kinds(kv_reserved)),
        )
        assert {t.kind for t in stage.terms if t.component == "rollout"} == expect
