"""State a stage creates (an optimizer's at its first step) in the residency ledger: counted at
the plan's size before it exists, at the measured size after, and in the device peak (no Ray)."""

from __future__ import annotations

from composed import composed_run

from rltrain.config import resolve_offload
from rltrain.config.offload import OffloadPolicy
from rltrain.placement.plan import build_plan
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec
from rltrain.runners.job import _planned_state, _stage_extra
from rltrain.scheduler.residency import ResidencyCoordinator, Resident

DEV = (0, 0)
MIB = 1024**2
ON_DEMAND = OffloadPolicy("on_demand", frozenset({"weights", "grads", "optimizer"}))


class Recorder:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def offload(self, kinds):
        self.log.append(("offload", self.name, tuple(kinds)))

    def reload(self, kinds):
        self.log.append(("reload", self.name, tuple(kinds)))


def fresh_actor() -> Resident:
    # at launch: 1 GiB weights, 1 GiB grads, no Adam moments yet (the plan says 2 GiB)
    return Resident(
        "actor",
        0,
        (DEV,),
        ON_DEMAND,
        {"weights": GIB, "grads": GIB, "optimizer": 0},
        planned={"weights": GIB, "grads": GIB, "optimizer": 2 * GIB},
    )


def test_first_train_lease_evicts_for_the_optimizer_state_it_will_create():
    # capacity 4.5 GiB, rollout weights 1 GiB: the actor's step needs 1 + 1 + 2 = 4 GiB, so only
    # 0.5 GiB may stay beside it and the rollout's weights must leave (counting the optimizer
    # as the 0 bytes measured at launch, 2 GiB needed 3.5 free: nothing left)
    co = ResidencyCoordinator({DEV: 4 * GIB + GIB // 2})
    log = []
    co.register(fresh_actor(), Recorder(log, "actor"))
    co.register(
        Resident("rollout", 0, (DEV,), ON_DEMAND, {"weights": GIB}), Recorder(log, "rollout")
    )
    assert co.usage(DEV) == 3 * GIB  # not created yet: not on the device
    plan = co.plan_stage("actor")
    assert [(e.component, e.kinds, e.bytes) for e in plan.evictions] == [
        ("rollout", ("weights",), GIB)
    ]
    with co.stage("actor"):
        assert co.usage(DEV) == 4 * GIB  # the stage holds the state it creates
        # measured after the update, in the lease: 2 GiB + 256 MiB of moments
        co.refresh("actor", 0, {"weights": GIB, "grads": GIB, "optimizer": 2 * GIB + 256 * MIB})
        assert co.usage(DEV) == 4 * GIB + 256 * MIB  # the measured size replaced the plan's
    assert log == [("offload", "rollout", ("weights",))]
    assert co.peak[DEV] == 4 * GIB + 256 * MIB


def test_refresh_notes_the_peak_outside_a_lease_and_ignores_unknown_ranks():
    co = ResidencyCoordinator({DEV: 8 * GIB})
    co.register(fresh_actor())
    co.register(Resident("rollout", 0, (DEV,), ON_DEMAND, {"weights": GIB}))
    assert co.peak[DEV] == 3 * GIB
    co.refresh("actor", 0, {"weights": GIB, "grads": GIB, "optimizer": 2 * GIB})
    assert co.peak[DEV] == 5 * GIB  # 4 GiB actor + 1 GiB rollout, both resident
    co.refresh("actor", 1, {"weights": 9 * GIB})
    assert co.peak[DEV] == 5 * GIB


def test_a_kind_measured_zero_again_counts_at_its_planned_size_in_its_stage():
    # ZeRO frees gradients at the step: measured 0 between stages, created in every update
    co = ResidencyCoordinator({DEV: 8 * GIB})
    co.register(fresh_actor())
    co.refresh("actor", 0, {"weights": GIB, "grads": 0, "optimizer": 2 * GIB})
    assert co.usage(DEV) == 3 * GIB
    with co.stage("actor"):
        assert co.usage(DEV) == 4 * GIB


def test_the_jobs_ledger_evicts_at_step_0_what_the_plan_evicts_for_train():
    settings = ("placement=collocated", "placement.fuse=false", "actor.micro_batch_size=64")
    run = composed_run(*settings)
    roomy = build_plan(run, ClusterSpec((NodeSpec(0, 1, 80 * GIB, "sim"),)))
    train = {
        t.kind: t.bytes for t in roomy.memory[DEV].stage("train").terms if t.component == "actor"
    }
    rollout_weights = next(
        t.bytes
        for t in roomy.memory[DEV].stage("generate").terms
        if (t.component, t.kind) == ("rollout", "weights")
    )
    # one byte short of holding the actor's training stage beside the rollout's weights
    capacity = sum(train.values()) + rollout_weights - 1
    plan = build_plan(run, ClusterSpec((NodeSpec(0, 1, capacity, "sim"),)))
    terms = {(t.component, t.kind): t for t in plan.memory[DEV].stage("train").terms}
    assert terms[("rollout", "weights")].status == "offloaded"

    co = ResidencyCoordinator({DEV: capacity})
    for comp, measured in (
        ("actor", {"weights": train["weights"], "grads": train["grads"], "optimizer": 0}),
        ("rollout", {"weights": rollout_weights}),
    ):
        policy = resolve_offload(run.placement.offload.get(comp), comp)
        co.register(
            Resident(
                comp,
                0,
                (DEV,),
                policy,
                measured,
                stage_extra=_stage_extra(plan, comp, DEV),
                planned=_planned_state(plan, comp, (DEV,), tuple(measured)),
            )
        )
    assert co.residents[("actor", 0)].planned["optimizer"] == train["optimizer"]
    lease = co.plan_stage("actor")
    assert [(e.component, e.kinds) for e in lease.evictions] == [("rollout", ("weights",))]
    with co.stage("actor"):
        pass
    assert co.peak[DEV] == sum(train.values())  # what the plan says the train stage holds
