"""What a process placed on a node (no device of its own) sees: its node's GPUs as Ray numbers
them on that node, e.g. 2,3 when the raylet was started with CUDA_VISIBLE_DEVICES=2,3 (a shared
host, a SLURM allocation). Hand-computed ids."""

from __future__ import annotations

from rltrain.placement.types import GIB, ClusterSpec, NodeSpec, Placement
from rltrain.scheduler.cluster import node_gpu_ids
from rltrain.scheduler.reservation import Reservation
from rltrain.scheduler.resources import ReservationLayout


def _on_node(node: int) -> Placement:
    # node-only: no devices of its own; sees the node's devices 0..1 (plan numbers)
    return Placement(0, node, 0, 0, "cuda", 0, 1, ("0", "1"), True, ())


def _on_device(node: int, device: int) -> Placement:
    return Placement(0, node, 0, device, "cuda", 0, 1, (str(device),), True, (device,))


def _reservation(node_devices):
    spec = ClusterSpec((NodeSpec(0, 2, 80 * GIB, "cuda"), NodeSpec(1, 2, 80 * GIB, "cuda")))
    physical = {(0, 0): 2, (0, 1): 3}  # what the device probes answered on node 0
    return Reservation("r", ReservationLayout((), ()), spec, None, physical, node_devices)


def test_a_node_process_sees_the_gpus_ray_owns_on_its_node():
    res = _reservation({0: (2, 3), 1: (0, 1)})
    assert res.visible_devices(_on_device(0, 0)) == (2,)  # a device process: as probed
    assert res.visible_devices(_on_node(0)) == (2, 3)  # was (0, 1): GPUs Ray was never given
    assert res.visible_devices(_on_node(1)) == (0, 1)


def test_a_node_without_known_ids_numbers_its_devices_from_0():
    # simulated devices: Ray numbers a node's declared GPUs 0..n-1
    assert _reservation(None).visible_devices(_on_node(1)) == (0, 1)


def test_ray_numbers_a_node_gpus_by_its_raylet_visible_devices():
    assert node_gpu_ids(None, 2) == (0, 1)
    assert node_gpu_ids(["2", "3"], 2) == (2, 3)
    assert node_gpu_ids(["4", "6", "7"], 2) == (4, 6)  # ray start --num-gpus=2
