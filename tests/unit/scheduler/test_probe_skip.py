"""Which device bundles a reservation must probe (a probe task costs a fresh worker process).

Only a node of simulated devices that the job holds whole has a known device map (plan device
``d`` is device ``d``); a partly held node or real GPUs are asked in the bundle, as before."""

from __future__ import annotations

from rltrain.placement.types import GIB, ClusterSpec, NodeSpec
from rltrain.scheduler.resources import Bundle, ReservationLayout


def _layout(*bundles: tuple[int, int | None]) -> ReservationLayout:
    return ReservationLayout(tuple(Bundle(n, d, 0.5) for n, d in bundles), ())


def _spec(*nodes: tuple[int, str]) -> ClusterSpec:
    return ClusterSpec(tuple(NodeSpec(r, n, 4 * GIB, a, 2.0) for r, (n, a) in enumerate(nodes)))


def test_whole_simulated_node_needs_no_probe():
    # the default run's reservation: both devices of one simulated node, in any bundle order
    layout = _layout((0, 1), (0, 0))
    assert layout.held_simulated_devices(_spec((2, "sim"))) == {(0, 1): 1, (0, 0): 0}


def test_partly_held_real_and_cpu_nodes_are_probed():
    spec = _spec((2, "sim"), (2, "cuda"), (2, "sim"))
    # node 0 held whole (known); node 1 real GPUs (Ray's ids may be remapped: probe); node 2
    # holds one of two devices (another job may hold the other: probe); a CPU bundle has none
    layout = _layout((0, 0), (0, 1), (1, 0), (1, 1), (2, 1), (2, None))
    assert layout.held_simulated_devices(spec) == {(0, 0): 0, (0, 1): 1}
