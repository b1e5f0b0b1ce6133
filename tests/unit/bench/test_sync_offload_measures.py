"""The pure parts of the weight_sync and offload measures, and the harness's Suite.teardown."""

from __future__ import annotations

import pytest

from rltrain.bench import harness
from rltrain.bench.harness import Case, Measure, Suite
from rltrain.bench.measures import offload, weight_sync
from rltrain.placement.types import ClusterSpec, NodeSpec


def test_teardown_runs_once_after_the_cases_and_on_failure():
    calls = []
    suite = Suite(
        cases=(Case("a", lambda: calls.append("a")),),
        baseline="a",
        warmup=1,
        repeats=2,
        teardown=lambda: calls.append("teardown"),
    )
    harness.run_measure(Measure("toy", "", lambda quick: suite))
    assert calls == ["a", "a", "a", "teardown"]

    def boom() -> None:
        raise RuntimeError("case failed")

    calls.clear()
    failing = Suite(cases=(Case("a", boom),), baseline="a", teardown=lambda: calls.append("t"))
    with pytest.raises(RuntimeError, match="case failed"):
        harness.run_measure(Measure("toy", "", lambda quick: failing))
    assert calls == ["t"]


class FakeMover:
    def __init__(self, log: list[str], i: int) -> None:
        self.log, self.i, self.offloaded = log, i, False

    def offload(self) -> None:
        self.log.append(f"off{self.i}")
        self.offloaded = True

    def reload(self) -> None:
        self.log.append(f"re{self.i}")
        self.offloaded = False


def test_offload_pool_gives_each_call_a_mover_in_the_right_state():
    log: list[str] = []
    pool = offload._Pool([FakeMover(log, i) for i in range(2)], sync=lambda: None)
    pool.offload(), pool.offload(), pool.reload(), pool.reload()
    assert log == ["off0", "off1", "re0", "re1"]  # planned: one move per timed call
    log.clear()
    pool.reload()  # more calls than planned: the state is fixed first, inside the call
    assert log == ["off0", "re0"]
    # the harness's rule: quick 1 warm-up + 1 timed call; else WARMUP 1 + REPEATS 5
    assert offload._calls(quick=True) == 2 and offload._calls(quick=False) == 6


def cluster(devices: list[int], kind: str = "sim") -> ClusterSpec:
    return ClusterSpec(
        nodes=tuple(
            NodeSpec(rank=i, num_devices=d, accelerator_type=kind) for i, d in enumerate(devices)
        )
    )


def test_receivers_get_their_own_devices_when_there_are_enough():
    ranks, how = weight_sync._receiver_devices(cluster([3, 2]), 4)
    assert ranks == [[1], [2], [3], [4]] and how == "each process on its own device"


def test_simulated_devices_are_shared_but_real_ones_are_not():
    ranks, how = weight_sync._receiver_devices(cluster([2]), 4)
    assert ranks == [[1], [1], [1], [1]] and "share 1 simulated" in how
    ranks, _ = weight_sync._receiver_devices(cluster([1]), 2)
    assert ranks == [[0], [0]]  # one device: everyone on it
    ranks, how = weight_sync._receiver_devices(cluster([3], kind="cuda"), 4)
    assert ranks == [[1], [2]] and "2 receivers fit" in how
