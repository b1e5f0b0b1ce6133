"""Residency decisions, checked against hand-computed byte counts (no Ray)."""

from __future__ import annotations

import pytest

from rltrain.config.offload import OffloadPolicy
from rltrain.errors import ResourceError
from rltrain.scheduler.residency import ResidencyCoordinator, Resident

GIB = 1024**3
DEV = (0, 0)
AFTER = OffloadPolicy("after_stage", frozenset({"weights", "grads", "optimizer", "kv_cache"}))
ON_DEMAND = OffloadPolicy("on_demand", frozenset({"weights", "grads", "optimizer"}))
NEVER = OffloadPolicy()


class Recorder:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def offload(self, kinds):
        self.log.append(("offload", self.name, tuple(kinds)))

    def reload(self, kinds):
        self.log.append(("reload", self.name, tuple(kinds)))


def actor(policy, dev=DEV, rank=0):
    # 1 GiB weights, 1 GiB grads, 2 GiB Adam moments = 4 GiB
    return Resident(
        "actor", rank, (dev,), policy, {"weights": GIB, "grads": GIB, "optimizer": 2 * GIB}
    )


def rollout(policy, dev=DEV, rank=0):
    # 1 GiB weights + 1 GiB KV cache = 2 GiB
    return Resident("rollout", rank, (dev,), policy, {"weights": GIB, "kv_cache": GIB})


def test_roomy_device_and_on_demand_means_zero_offloads():
    co = ResidencyCoordinator({DEV: 8 * GIB})
    co.register(actor(ON_DEMAND))
    co.register(rollout(OffloadPolicy("on_demand", frozenset({"weights", "kv_cache"}))))
    for _ in range(3):
        with co.stage("rollout"):
            pass
        with co.stage("actor"):
            pass
    assert co.counts() == {}
    assert co.peak[DEV] == 6 * GIB


def test_tight_device_evicts_only_what_is_needed_largest_first():
    # capacity 5 GiB: actor 4 + rollout 2 = 6 -> 1 GiB short; the optimizer (2 GiB) goes.
    co = ResidencyCoordinator({DEV: 5 * GIB})
    log = []
    co.register(actor(ON_DEMAND), Recorder(log, "actor"))
    co.register(
        rollout(OffloadPolicy("on_demand", frozenset({"weights", "kv_cache"}))),
        Recorder(log, "rollout"),
    )
    plan = co.plan_stage("rollout")
    assert [(e.component, e.kinds, e.bytes) for e in plan.evictions] == [
        ("actor", ("optimizer",), 2 * GIB)
    ]
    with co.stage("rollout"):
        assert co.usage(DEV) == 4 * GIB  # 1 + 1 actor weights/grads + 2 rollout
    with co.stage("actor"):
        pass
    # actor needs 4: rollout (2) must drop 1 GiB; kinds are 1 GiB each, sorted -> one goes
    assert log[0] == ("offload", "actor", ("optimizer",))
    assert log[1][0:2] == ("offload", "rollout") and len(log[1][2]) == 1
    assert log[2] == ("reload", "actor", ("optimizer",))
    assert co.peak[DEV] <= 6 * GIB


def test_after_stage_components_leave_after_each_stage():
    co = ResidencyCoordinator({DEV: 4 * GIB})
    log = []
    # after-stage workers start off the device (built on the host, loaded on first use)
    a, r = actor(AFTER), rollout(AFTER)
    a.offloaded, r.offloaded = set(a.total), set(r.total)
    co.register(a, Recorder(log, "actor"))
    co.register(r, Recorder(log, "rollout"))
    with co.stage("rollout"):
        assert co.usage(DEV) == 2 * GIB
    with co.stage("actor"):
        assert co.usage(DEV) == 4 * GIB
    assert log == [
        ("reload", "rollout", ("kv_cache", "weights")),
        ("offload", "rollout", ("kv_cache", "weights")),
        ("reload", "actor", ("grads", "optimizer", "weights")),
        ("offload", "actor", ("grads", "optimizer", "weights")),
    ]
    assert co.peak[DEV] == 4 * GIB  # never both: capacity held exactly


def test_stage_extra_counts_only_during_the_lease():
    co = ResidencyCoordinator({DEV: 4 * GIB})
    r = rollout(NEVER)
    r.stage_extra = GIB // 2
    co.register(r)
    with co.stage("rollout"):
        assert co.usage(DEV) == 2 * GIB + GIB // 2
    assert co.usage(DEV) == 2 * GIB


def test_impossible_fit_names_device_residents_shortfall_and_fix():
    co = ResidencyCoordinator({DEV: 5 * GIB})
    co.register(actor(NEVER))
    co.register(rollout(AFTER))
    with pytest.raises(ResourceError) as info:
        co.plan_stage("rollout")
    text = str(info.value)
    assert "device (0, 0)" in text
    assert "actor rank 0 4.00 GiB" in text
    assert "Shortfall 1.00 GiB" in text
    assert "placement.offload.actor" in text


def test_lease_is_all_or_nothing_across_devices_of_a_tp2_process():
    d0, d1 = (0, 0), (0, 1)
    co = ResidencyCoordinator({d0: 4 * GIB, d1: 3 * GIB})
    log = []
    co.register(actor(ON_DEMAND, dev=d0, rank=0), Recorder(log, "a0"))
    co.register(actor(NEVER, dev=d1, rank=1), Recorder(log, "a1"))
    # a TP=2 rollout process spans both devices, 2 GiB on each
    co.register(Resident("rollout", 0, (d0, d1), AFTER, {"weights": GIB, "kv_cache": GIB}))
    with pytest.raises(ResourceError, match=r"device \(0, 1\)"):
        co.plan_stage("rollout")
    assert log == []  # nothing was evicted from device 0 for a lease that cannot be granted


class Waiter:
    def __init__(self, log, what):
        self.log, self.what = log, what

    def wait(self):
        self.log.append(("awaited", *self.what))


class Deferred(Recorder):
    """A handle whose moves return futures, like a worker group's."""

    offload_future = Waiter

    def offload(self, kinds):
        super().offload(kinds)
        return self.offload_future(self.log, ("offload", self.name))

    def reload(self, kinds):
        super().reload(kinds)
        return Waiter(self.log, ("reload", self.name))


def test_moves_are_awaited_as_late_as_their_order_allows():
    co = ResidencyCoordinator({DEV: 4 * GIB})
    log = []
    a, r = actor(AFTER), rollout(AFTER)
    a.offloaded, r.offloaded = set(a.total), set(r.total)
    co.register(a, Deferred(log, "actor"))
    co.register(r, Deferred(log, "rollout"))
    with co.stage("rollout"):
        log.append(("body", "rollout"))  # the stage's calls queue behind the started reload
    assert log == [
        ("reload", "rollout", ("kv_cache", "weights")),
        ("body", "rollout"),
        ("awaited", "reload", "rollout"),
        ("offload", "rollout", ("kv_cache", "weights")),  # started, not awaited
    ]
    assert co.usage(DEV) == 0  # accounted as gone: the next lease plans with the room
    log.clear()
    with co.stage("actor"):
        # the rollout's offload was awaited before the actor's reload started
        assert log[:2] == [
            ("awaited", "offload", "rollout"),
            ("reload", "actor", ("grads", "optimizer", "weights")),
        ]
    co.flush()
    assert log[-1] == ("awaited", "offload", "actor")
    assert [e.kind for e in co.events if e.kind != "grant"] == [
        "reload",
        "offload",
        "reload",
        "offload",
    ]


def test_a_failed_stage_drops_its_reloads_and_moves_nothing_more():
    co = ResidencyCoordinator({DEV: 4 * GIB})
    log = []
    r = rollout(AFTER)
    r.offloaded = set(r.total)
    co.register(r, Deferred(log, "rollout"))
    with pytest.raises(RuntimeError), co.stage("rollout"):
        raise RuntimeError("worker died")
    co.flush()
    assert log == [("reload", "rollout", ("kv_cache", "weights"))]


class Slow(Waiter):
    """A move still running: ``done()`` stays False until awaited."""

    def done(self):
        return False


class SlowHandle(Deferred):
    offload_future = Slow


def test_a_stage_that_fits_does_not_wait_for_offloads_still_running():
    # 8 GiB holds actor (4) and rollout (2) at once: after_stage moves them by policy, not for
    # room, so the actor's stage need not wait for the rollout's offload to finish.
    co = ResidencyCoordinator({DEV: 8 * GIB})
    log = []
    a, r = actor(AFTER), rollout(AFTER)
    a.offloaded, r.offloaded = set(a.total), set(r.total)
    co.register(a, SlowHandle(log, "actor"))
    co.register(r, SlowHandle(log, "rollout"))
    with co.stage("rollout"):
        pass
    with co.stage("actor"):
        assert ("awaited", "offload", "rollout") not in log
    co.flush()
    assert log[-2:] == [("awaited", "offload", "rollout"), ("awaited", "offload", "actor")]
    # on the 4 GiB device of the test above the same stage waits (it needs the room)


def test_kinds_of_zero_bytes_never_move():
    # before its first step an actor's optimizer (and here its gradients) hold nothing: an
    # offload span for them would move nothing
    co = ResidencyCoordinator({DEV: 8 * GIB})
    log = []
    co.register(
        Resident("actor", 0, (DEV,), AFTER, {"weights": GIB, "grads": 0, "optimizer": 0}),
        Recorder(log, "actor"),
    )
    co.register(
        Resident("rollout", 0, (DEV,), AFTER, {"weights": 0, "kv_cache": 0}),
        Recorder(log, "rollout"),
    )
    co.offload_all("actor")
    co.offload_all("rollout")
    with co.stage("rollout"):
        pass
    co.flush()
    assert log == [("offload", "actor", ("weights",))]
    assert co.counts() == {("actor", "offload"): 1}


def test_on_demand_evicts_the_resident_with_most_movable_bytes_first():
    # capacity 10 GiB; rollout needs 4; actor holds 1+1+2 = 4, critic 2+2+1 = 5: 3 GiB short.
    # The critic (5 GiB movable) goes first, its 2 GiB kinds by name (grads, then weights),
    # and nothing more once 4 GiB are free: 13 - 4 = 9 GiB stay on the device.
    co = ResidencyCoordinator({DEV: 10 * GIB})
    co.register(actor(ON_DEMAND))
    co.register(
        Resident(
            "critic", 0, (DEV,), ON_DEMAND, {"weights": 2 * GIB, "grads": 2 * GIB, "optimizer": GIB}
        )
    )
    co.register(Resident("rollout", 0, (DEV,), NEVER, {"weights": GIB, "kv_cache": 3 * GIB}))
    with co.stage("rollout") as lease:
        assert [(e.component, e.kinds, e.bytes) for e in lease.evictions] == [
            ("critic", ("grads", "weights"), 4 * GIB)
        ]
        assert co.usage(DEV) == 9 * GIB
