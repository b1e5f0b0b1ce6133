"""What a job reserves in Ray for its placements: bundles, CPU shares and thread counts.

Pure (no Ray): :func:`plan_reservation` turns the placements of every component into the bundle
list of one placement group plus, for every process, the bundle it starts in, the CPUs it asks
for inside that bundle and its torch thread count.

Rules (DESIGN.md, "Ray resource model"):

- one bundle per device the job uses: ``{"GPU": 1, "CPU": share}``, pinned to its node;
- one CPU bundle per node that hosts node-only processes (no devices);
- on each node the job takes the node's cores in proportion to the devices it uses there
  (``cpus * used / devices``), split evenly over its bundles on that node; a job with only
  node-only processes on a node takes one device's worth (all cores of a CPU-only node). So two
  jobs on disjoint devices of a node both fit;
- a process starts in the bundle of its first device (node-only processes in their node's CPU
  bundle) and asks for an equal part of that bundle's CPUs, so collocated processes fit;
- torch threads = the job's cores on the node // the component's processes on that node (they run
  at the same time in their stage), at least 1. Ray's default (1 thread for a fractional-CPU
  actor) halves a small model's speed on 2 cores. Components that work at the same time
  (``overlap``: actor and rollout with asynchronous rollout, env and rollout in a pipeline) are
  counted together, so their threads do not oversubscribe the node's cores.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rltrain.errors import PlacementError
from rltrain.placement.types import ClusterSpec, Placement

#: Ray accounts resources in units of 1e-4; shares are rounded down to it.
RAY_UNIT = 1e-4


def _floor(x: float) -> float:
    return math.floor(x * 10_000 + 1e-9) / 10_000  # divide last: 0.6666, not 0.66660..01


@dataclass(frozen=True)
class Bundle:
    """One bundle of the job's placement group.

    Attributes:
        node_rank: the node it must land on.
        device: the plan's local device id, or None for a node-only CPU bundle.
        cpus: CPUs reserved in the bundle.
    """

    node_rank: int
    device: int | None
    cpus: float

    def resources(self) -> dict[str, float]:
        """The Ray resource dict of the bundle."""
        out = {"CPU": self.cpus}
        if self.device is not None:
            out["GPU"] = 1.0
        return out


@dataclass(frozen=True)
class ProcessSlot:
    """Where one process of one component starts inside the reservation.

    Attributes:
        component: the component (worker group) name.
        rank: the process's rank in its component.
        bundle_index: the bundle it starts in.
        cpus: CPUs it asks for inside that bundle.
        num_threads: torch / OpenMP threads for it.
    """

    component: str
    rank: int
    bundle_index: int
    cpus: float
    num_threads: int


@dataclass(frozen=True)
class ReservationLayout:
    """The bundles of a job's placement group and where each process starts in them."""

    bundles: tuple[Bundle, ...]
    slots: tuple[ProcessSlot, ...]

    def slot(self, component: str, rank: int) -> ProcessSlot:
        """The slot of ``component`` rank ``rank``.

        Raises:
            PlacementError: when the reservation was made without that process.
        """
        for s in self.slots:
            if s.component == component and s.rank == rank:
                return s
        known = sorted({s.component for s in self.slots})
        raise PlacementError(
            f"component {component!r} rank {rank} is not part of this reservation (it holds "
            f"{known}): reserve for every component you launch into it"
        )

    def device_bundles(self) -> dict[tuple[int, int], int]:
        """``(node_rank, device) -> bundle index`` for every device bundle."""
        return {
            (b.node_rank, b.device): i for i, b in enumerate(self.bundles) if b.device is not None
        }

    def held_simulated_devices(self, spec: ClusterSpec) -> dict[tuple[int, int], int]:
        """``(node_rank, device) -> device id`` for bundles whose device needs no asking.

        On a node with simulated devices (``sim``) whose every device this reservation holds,
        plan device ``d`` is device ``d``: no other job can hold any of that node's devices,
        so every one-to-one map is as exclusive as the one Ray chose, and Ray numbers a node's
        declared GPUs ``0..n-1`` (the numbering node placements already see). Bundles not
        listed here need a probe in the bundle to learn the device Ray gave it.

        Args:
            spec: the cluster the placements were resolved against.

        Returns:
            The map for the fully held simulated nodes' device bundles (possibly empty).
        """
        per_node = Counter(node for node, _ in self.device_bundles())
        return {
            (node, dev): dev
            for node, dev in self.device_bundles()
            if spec.nodes[node].accelerator_type == "sim"
            and per_node[node] == spec.nodes[node].num_devices
        }

    def node_cpus(self, node_rank: int) -> float:
        """CPUs the job holds on a node."""
        return sum(b.cpus for b in self.bundles if b.node_rank == node_rank)


def _check(component: str, p: Placement, spec: ClusterSpec) -> None:
    if not 0 <= p.cluster_node_rank < spec.num_nodes:
        raise PlacementError(
            f"{component} rank {p.rank} is placed on node {p.cluster_node_rank}, but the cluster "
            f"has nodes 0-{spec.num_nodes - 1}: fix placement.component_placement or add nodes"
        )
    node = spec.nodes[p.cluster_node_rank]
    bad = [d for d in p.device_ids if not 0 <= d < node.num_devices]
    if bad:
        raise PlacementError(
            f"{component} rank {p.rank} uses devices {bad} on node {node.rank}, which has "
            f"{node.num_devices} device(s): fix placement.component_placement or "
            f"cluster.devices_per_node"
        )


def _node_bundles(
    spec: ClusterSpec, devices: set[tuple[int, int]], cpu_nodes: set[int]
) -> tuple[list[Bundle], dict[int, float]]:
    """The bundles per node, and the job's (unrounded) CPU share of each node it uses."""
    bundles: list[Bundle] = []
    totals: dict[int, float] = {}
    for node in spec.nodes:
        used = sorted(d for n, d in devices if n == node.rank)
        extra = 1 if node.rank in cpu_nodes else 0
        if not used and not extra:
            continue
        if used:
            total = node.num_cpus * len(used) / node.num_devices
        else:
            total = node.num_cpus / max(1, node.num_devices)
        totals[node.rank] = total
        share = _floor(total / (len(used) + extra))
        if share <= 0:
            raise PlacementError(
                f"node {node.rank} has {node.num_cpus} CPUs, too few to share over "
                f"{len(used) + extra} bundles: raise cluster.cpus_per_node"
            )
        bundles.extend(Bundle(node.rank, d, share) for d in used)
        if extra:
            bundles.append(Bundle(node.rank, None, share))
    return bundles, totals


def plan_reservation(
    placements: Mapping[str, Sequence[Placement]],
    spec: ClusterSpec,
    overlap: Sequence[frozenset[str]] = (),
) -> ReservationLayout:
    """Compute the job's bundles and each process's slot.

    Args:
        placements: every component's placements (component name -> one per rank).
        spec: the cluster the placements were resolved against.
        overlap: sets of components whose stages run at the same time; a process's thread
            count divides the node's cores over the processes of its whole set there.

    Returns:
        The layout; bundles are ordered by node, devices first, then the node's CPU bundle.

    Raises:
        PlacementError: when a placement names a node or device the cluster lacks.
    """
    devices: set[tuple[int, int]] = set()
    cpu_nodes: set[int] = set()
    for component, procs in placements.items():
        for p in procs:
            _check(component, p, spec)
            if p.device_ids:
                devices.update((p.cluster_node_rank, d) for d in p.device_ids)
            else:
                cpu_nodes.add(p.cluster_node_rank)
    bundles, job_cpus = _node_bundles(spec, devices, cpu_nodes)
    by_device = {(b.node_rank, b.device): i for i, b in enumerate(bundles) if b.device is not None}
    by_node = {b.node_rank: i for i, b in enumerate(bundles) if b.device is None}

    def home(p: Placement) -> int:
        if p.device_ids:
            return by_device[(p.cluster_node_rank, p.device_ids[0])]
        return by_node[p.cluster_node_rank]

    per_bundle = Counter(home(p) for procs in placements.values() for p in procs)
    slots = []
    for component, procs in placements.items():
        together = {component}.union(*(s for s in overlap if component in s))
        per_node = Counter(
            q.cluster_node_rank for c in together if c in placements for q in placements[c]
        )
        for p in procs:
            idx = home(p)
            threads = max(
                1, int(job_cpus[p.cluster_node_rank] + 1e-6) // per_node[p.cluster_node_rank]
            )
            cpus = _floor(bundles[idx].cpus / per_bundle[idx])
            slots.append(ProcessSlot(component, p.rank, idx, max(cpus, RAY_UNIT), threads))
    return ReservationLayout(bundles=tuple(bundles), slots=tuple(slots))
