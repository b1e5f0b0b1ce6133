"""A job's reservation: one Ray placement group for everything its plan uses.

:meth:`Reservation.create` places one bundle per device (GPU 1 + CPU share) and one CPU bundle per
node with node-only processes (holding the tool pool's fixed CPU and ``memory`` asks), each
pinned to its node by the ``ray.io/node-id`` label; waits for it with a timeout (a request Ray
cannot satisfy would otherwise wait for ever); then asks Ray, with one probe task per device
bundle, which physical device backs each bundle (not needed on a node of simulated devices the
job holds whole: see
:meth:`~rltrain.scheduler.resources.ReservationLayout.held_simulated_devices`). The plan's device
ids are job-local: ``CUDA_VISIBLE_DEVICES`` of a worker is built from this map, so two jobs on one
Ray cluster never share a device while components collocated by the plan do.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rltrain.errors import ResourceError
from rltrain.placement.types import ClusterSpec, Placement
from rltrain.scheduler.resources import ProcessAsk, ReservationLayout, plan_reservation

NODE_ID_LABEL = "ray.io/node-id"


@ray.remote(num_cpus=0, num_gpus=1, max_retries=0)
def _probe_device() -> tuple[str, list[int]]:
    """Which node and physical device Ray gave the bundle this runs in."""
    return ray.get_runtime_context().get_node_id(), [int(i) for i in ray.get_gpu_ids()]


def _missing(layout: ReservationLayout, spec: ClusterSpec) -> str:
    """Say, per node, what the reservation asks for and what Ray has free there."""
    try:
        free = ray._private.state.available_resources_per_node()  # GCS view, no dashboard
    except Exception:  # an older/newer Ray without it: report the request alone
        free = {}
    lines = []
    for node in spec.nodes:
        want_gpu = sum(
            1 for b in layout.bundles if b.node_rank == node.rank and b.device is not None
        )
        want_cpu = layout.node_cpus(node.rank)
        want_mem = sum(b.memory_bytes for b in layout.bundles if b.node_rank == node.rank)
        if not want_gpu and not want_cpu:
            continue
        have = free.get(node.ray_node_id or "", {})
        mem = (
            f", memory {want_mem / 2**30:.3g} GiB (free {have.get('memory', 0) / 2**30:.3g})"
            if want_mem
            else ""
        )
        lines.append(
            f"node {node.rank} ({(node.ray_node_id or '?')[:12]}): needs GPU {want_gpu}, "
            f"CPU {want_cpu:.4g}; free GPU {have.get('GPU', 0):g}, CPU {have.get('CPU', 0):.4g}"
            f"{mem}"
        )
    return "; ".join(lines)


class Reservation:
    """The placement group holding a job's devices, and the job-local device map.

    Attributes:
        name: the placement group's name.
        layout: bundles and process slots (see :mod:`rltrain.scheduler.resources`).
        spec: the cluster the placements were resolved against.
        pg: the Ray placement group.
        physical: ``(node_rank, plan device) -> device id on that node`` as Ray assigned it.
        node_devices: ``node_rank -> the ids of the node's GPUs as Ray hands them out`` (its
            raylet's ``CUDA_VISIBLE_DEVICES``, e.g. ``(2, 3)``); a node missing here numbers
            them ``0..n-1`` (simulated devices, or Ray's own numbering).
    """

    def __init__(
        self,
        name: str,
        layout: ReservationLayout,
        spec: ClusterSpec,
        pg: PlacementGroup,
        physical: Mapping[tuple[int, int], int],
        node_devices: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        self.name = name
        self.layout = layout
        self.spec = spec
        self.pg = pg
        self.physical = dict(physical)
        self.node_devices = {n: tuple(ids) for n, ids in (node_devices or {}).items()}
        self.removed = False

    @classmethod
    def create(
        cls,
        placements: Mapping[str, Sequence[Placement]],
        spec: ClusterSpec,
        timeout_s: float,
        name: str | None = None,
        overlap: Sequence[frozenset[str]] = (),
        asks: Mapping[str, ProcessAsk] | None = None,
        node_devices: Mapping[int, Sequence[int]] | None = None,
    ) -> Reservation:
        """Reserve what ``placements`` use and learn which devices Ray gave.

        Args:
            placements: component name -> its placements.
            spec: the live cluster (nodes must carry Ray node ids).
            timeout_s: how long to wait for Ray to place every bundle.
            name: the placement group's name (default: a unique ``rltrain-<hex>``).
            overlap: components working at the same time (see :func:`plan_reservation`).
            asks: components whose processes ask fixed CPUs / memory (the tool pool).
            node_devices: node rank -> its GPUs' ids as Ray hands them out (see the class).

        Returns:
            The ready reservation.

        Raises:
            ResourceError: when Ray cannot place the bundles within ``timeout_s`` (the message
                lists what each node lacks); nothing stays reserved.
            PlacementError: when a placement names a node or device the cluster lacks.
        """
        layout = plan_reservation(placements, spec, overlap, asks)
        name = name or f"rltrain-{uuid.uuid4().hex[:10]}"
        selectors = [{NODE_ID_LABEL: spec.nodes[b.node_rank].ray_node_id} for b in layout.bundles]
        pg = placement_group(
            [b.resources() for b in layout.bundles],
            strategy="PACK",
            name=name,
            bundle_label_selector=selectors,
        )
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            detail = _missing(layout, spec)
            remove_placement_group(pg)
            raise ResourceError(
                f"Ray could not reserve the job's devices within {timeout_s:g} s "
                f"(cluster.startup_timeout_s): {detail}. Free devices held by other jobs, "
                f"use fewer devices in placement.component_placement, or add nodes"
            )
        try:
            physical = cls._probe(layout, pg, spec, timeout_s)
        except BaseException:
            remove_placement_group(pg)
            raise
        return cls(name, layout, spec, pg, physical, node_devices)

    @staticmethod
    def _probe(
        layout: ReservationLayout, pg: PlacementGroup, spec: ClusterSpec, timeout_s: float
    ) -> dict[tuple[int, int], int]:
        # A probe is a task, and a task's worker process is never reused for an actor: each
        # probe costs a fresh interpreter (~0.8 CPU-s on the 2-core machine) on the path to
        # the first step. Devices that need no asking are not probed.
        physical = layout.held_simulated_devices(spec)
        bundles = {k: i for k, i in layout.device_bundles().items() if k not in physical}
        if not bundles:
            return physical
        refs = {
            key: _probe_device.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, idx)
            ).remote()
            for key, idx in bundles.items()
        }
        try:
            answers = ray.get(list(refs.values()), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ResourceError(
                f"probing which devices back the job's {len(refs)} device bundle(s) took longer "
                f"than {timeout_s:g} s (cluster.startup_timeout_s): the cluster is overloaded"
            ) from None
        for (node_rank, device), (node_id, gpu_ids) in zip(refs, answers, strict=True):
            expected = spec.nodes[node_rank].ray_node_id
            if node_id != expected or len(gpu_ids) != 1:
                raise ResourceError(
                    f"Ray placed the bundle of node {node_rank} device {device} on node "
                    f"{node_id[:12]} with GPUs {gpu_ids}, expected node {str(expected)[:12]} "
                    f"and one GPU: the cluster changed while reserving; retry"
                )
            physical[(node_rank, device)] = gpu_ids[0]
        return physical

    def strategy(self, component: str, rank: int) -> PlacementGroupSchedulingStrategy:
        """The Ray scheduling strategy that starts ``component`` rank ``rank`` in its bundle."""
        slot = self.layout.slot(component, rank)
        return PlacementGroupSchedulingStrategy(
            self.pg, placement_group_bundle_index=slot.bundle_index
        )

    def visible_devices(self, p: Placement) -> tuple[int, ...]:
        """Physical device ids to expose to the process (``CUDA_VISIBLE_DEVICES``).

        Isolated processes see their own devices; other device processes see every device the
        job reserved on their node, in plan order. A process placed on a node or on other
        hardware (``node_group: node``, ``NodePlacementStrategy``, a robot group) sees every
        device of its node, as in RLinf, and reserves none of them: its ``visible_accelerators``
        are the node's device numbers ``0..n-1``, each shown as the id Ray gives that GPU
        (:attr:`node_devices`), so it sees the GPUs Ray owns there and no others.
        """
        if not p.device_ids:
            ids = self.node_devices.get(p.cluster_node_rank)
            return tuple(int(v) if ids is None else ids[int(v)] for v in p.visible_accelerators)
        if p.isolate_accelerator:
            return tuple(self.physical[(p.cluster_node_rank, d)] for d in p.device_ids)
        return tuple(
            dev for (node, _), dev in sorted(self.physical.items()) if node == p.cluster_node_rank
        )

    def remove(self) -> None:
        """Release the placement group (idempotent)."""
        if not self.removed:
            self.removed = True
            try:
                remove_placement_group(self.pg)
            except Exception:  # Ray already shut down: nothing is left to release
                pass

    def describe(self) -> dict[str, Any]:
        """A small summary for logs: bundles and the device map."""
        return {
            "name": self.name,
            "bundles": [b.resources() | {"node": b.node_rank} for b in self.layout.bundles],
            "devices": {f"node{n}/dev{d}": phys for (n, d), phys in self.physical.items()},
        }
