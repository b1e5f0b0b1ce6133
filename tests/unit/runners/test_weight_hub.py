"""The weight hub's bookkeeping with stand-in groups: which actor ranks export for which
receiver, what each receiver is handed, and the version (the transports themselves run in
tests/integration/runners/test_engines.py and the IPC tests)."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

from rltrain.backends.weight_sync.transport import CollectiveVersion
from rltrain.placement.transport_choice import TransportChoice
from rltrain.runners.weight_hub import WeightHub


class Future:
    def __init__(self, refs: list[Any], results: list[Any]) -> None:
        self.refs, self.results = refs, results

    def wait(self, timeout: float | None = None) -> list[Any]:
        return self.results


class Group:
    """Records every call; a call on ranks answers one result per rank."""

    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name, self.log, self.ranks = name, log, None

    def execute_on(self, *ranks: int) -> Group:
        g = Group(self.name, self.log)
        g.ranks = ranks
        return g

    def call(self, method: Any, *args: Any) -> Future:
        self.log.append((self.name, method, self.ranks, args))
        n = len(self.ranks or (0,))
        return Future([f"ref-{self.name}-{args}"], [f"{self.name}{r}" for r in range(n)])


class Actor:
    setup_weight_sync = "setup"
    export_weights = "export"
    release_weights = "release"
    flush_weight_sync = "flush"


class Rollout:
    setup_weight_sync = "setup"
    catch_up = "catch_up"


def hub(choices: dict[str, TransportChoice]) -> tuple[WeightHub, list[tuple[Any, ...]]]:
    log: list[tuple[Any, ...]] = []
    groups = SimpleNamespace(
        actor=Group("actor", log),
        receiver=lambda r: Group(r, log) if r in choices else None,
    )
    run = SimpleNamespace(cluster=SimpleNamespace(collective_timeout_s=5.0))
    job = SimpleNamespace(run=run, plan=None, stage=lambda c: nullcontext())
    h = WeightHub(job, groups, Actor, Rollout, fused=True)  # no set-up: choices given below
    h.transports = choices
    return h, log


def test_receivers_on_the_object_store_share_one_export_and_ipc_maps_its_sources():
    h, log = hub(
        {
            "rollout": TransportChoice("host", "test"),
            "inference": TransportChoice("host", "test", receiver="inference"),
        }
    )
    h.export(3)
    exports = [c for c in log if c[1] == "export"]
    assert len(exports) == 1 and exports[0][3] == (3, "rollout")
    assert h.handed_to("rollout") == h.handed_to("inference") == "ref-actor-(3, 'rollout')"
    assert h.version == 3

    h, log = hub({"rollout": TransportChoice("ipc", "test", feeders=((0, (0,)), (1, (1,))))})
    h.handed(5, h.submit_exports(5))
    assert h.handed_to("rollout") == {0: "actor0", 1: "actor1"}  # by source actor rank
    h.finish()
    assert [c[1:3] for c in log if c[1] == "release"] == [("release", (0, 1))]


def test_collective_receivers_catch_up_before_the_sources_flush():
    choice = TransportChoice("collective", "test", backend="gloo", feeders=((0, (0,)),))
    h, log = hub({"rollout": choice})
    h.handed(2, h.submit_exports(2))
    assert h.handed_to("rollout") == CollectiveVersion(2)
    h.finish()
    assert [c[1] for c in log][-2:] == ["catch_up", "flush"]
    assert h.handed_to("inference") is None


def test_the_embodied_hub_hands_the_rollout_rank_0s_host_buckets_without_set_up():
    log: list[tuple[Any, ...]] = []
    groups = SimpleNamespace(actor=Group("actor", log), receiver=lambda r: Group(r, log))
    run = SimpleNamespace(cluster=SimpleNamespace(collective_timeout_s=5.0))
    job = SimpleNamespace(run=run, plan=None, stage=lambda c: nullcontext())
    h = WeightHub.host_only(job, groups, Actor, Rollout)
    assert log == []  # nothing set up on the workers
    h.export(4, lease=False)
    assert log == [("actor", "export", (0,), (4, "rollout"))]
    assert h.handed_to("rollout") == "ref-actor-(4, 'rollout')" and h.version == 4
