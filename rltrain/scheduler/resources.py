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
- a component with a fixed ask (:class:`ProcessAsk`: the tool pool's ``tools.cpus_per_worker``
  and ``tools.memory_gib_per_worker``) is node-only; each of its processes asks exactly that,
  and its node's CPU bundle holds those asks on top of the equal parts of the other node-only
  processes. What the job then takes of the node is
  :func:`~rltrain.placement.tools.split_node_cpus` (the rule the plan refuses a pool by): the
  fixed asks whole, the usual share for the rest, shrunk to fit the node's cores. Memory asks go
  to Ray's ``memory`` resource of the bundle;
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
from rltrain.placement.tools import TOOLS, ToolPool, split_node_cpus
from rltrain.placement.types import ClusterSpec, Placement

#: Ray accounts resources in units of 1e-4; shares are rounded down to it.
RAY_UNIT = 1e-4


def _floor(x: float) -> float:
    return math.floor(x * 10_000 + 1e-9) / 10_000  # divide last: 0.6666, not 0.66660..01


@dataclass(frozen=True)
class ProcessAsk:
    """What each process of a component asks Ray for, whatever else shares its node.

    Attributes:
        cpus: CPUs per process (> 0).
        memory_bytes: Ray ``memory`` per process in bytes (0: none reserved).
    """

    cpus: float
    memory_bytes: int = 0


def tool_asks(pool: ToolPool | None) -> dict[str, ProcessAsk]:
    """The fixed asks of a plan's tool pool (``tools.cpus_per_worker`` and
    ``tools.memory_gib_per_worker`` per worker); empty without a pool."""
    if pool is None:
        return {}
    return {TOOLS: ProcessAsk(pool.cpus_per_worker, pool.memory_bytes_per_worker)}


@dataclass(frozen=True)
class Bundle:
    """One bundle of the job's placement group.

    Attributes:
        node_rank: the node it must land on.
        device: the plan's local device id, or None for a node-only CPU bundle.
        cpus: CPUs reserved in the bundle.
        memory_bytes: Ray ``memory`` reserved in the bundle (0: none).
    """

    node_rank: int
    device: int | None
    cpus: float
    memory_bytes: int = 0

    def resources(self) -> dict[str, float]:
        """The Ray resource dict of the bundle."""
        out = {"CPU": self.cpus}
        if self.device is not None:
            out["GPU"] = 1.0
        if self.memory_bytes:
            out["memory"] = float(self.memory_bytes)
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
        memory_bytes: Ray ``memory`` it asks for (0: none).
    """

    component: str
    rank: int
    bundle_index: int
    cpus: float
    num_threads: int
    memory_bytes: int = 0


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


def _ask_cpus(ask: ProcessAsk) -> float:
    """A fixed ask in Ray's units (at least one unit)."""
    return max(_floor(ask.cpus), RAY_UNIT)


@dataclass(frozen=True)
class _NodeUse:
    """What the job places on one node: device ids, other node-only processes, fixed asks."""

    devices: tuple[int, ...] = ()
    node_only: int = 0
    fixed_cpus: float = 0.0
    fixed_memory: int = 0


def _node_bundles(
    spec: ClusterSpec, use: Mapping[int, _NodeUse]
) -> tuple[list[Bundle], dict[int, float], dict[int, float]]:
    """The bundles per node, the CPUs of each node's other processes' equal parts (the
    node-only bundle's part besides the fixed asks), and the job's usual (unrounded) CPU share
    of each node (for thread counts)."""
    bundles: list[Bundle] = []
    totals: dict[int, float] = {}
    parts: dict[int, float] = {}
    for node in spec.nodes:
        u = use.get(node.rank)
        if u is None:
            continue
        extra = 1 if u.node_only else 0
        if u.devices:
            total = node.num_cpus * len(u.devices) / node.num_devices
        else:
            total = node.num_cpus / max(1, node.num_devices)
        totals[node.rank] = total
        split = split_node_cpus(total, u.fixed_cpus, node.num_cpus, bool(u.devices or extra))
        count = len(u.devices) + extra
        share = _floor(split.rest / count) if count else 0.0
        if count and share <= 0:
            raise PlacementError(
                f"node {node.rank} has {node.num_cpus} CPUs, too few to share over "
                f"{count} bundles besides {u.fixed_cpus:g} CPUs of fixed asks "
                f"(tools.cpus_per_worker): raise cluster.cpus_per_node or lower the asks"
            )
        bundles.extend(Bundle(node.rank, d, share) for d in u.devices)
        if extra or u.fixed_cpus:
            parts[node.rank] = share if extra else 0.0
            cpus = _floor(parts[node.rank] + u.fixed_cpus)
            bundles.append(Bundle(node.rank, None, cpus, u.fixed_memory))
    return bundles, parts, totals


def _node_use(
    placements: Mapping[str, Sequence[Placement]],
    spec: ClusterSpec,
    asks: Mapping[str, ProcessAsk],
) -> dict[int, _NodeUse]:
    """Per node, what the job places there (checking every placement against the cluster)."""
    devices: dict[int, set[int]] = {}
    node_only: Counter[int] = Counter()
    fixed: dict[int, tuple[float, int]] = {}
    for component, procs in placements.items():
        ask = asks.get(component)
        for p in procs:
            _check(component, p, spec)
            node = p.cluster_node_rank
            if ask is not None and p.device_ids:
                raise PlacementError(
                    f"{component} rank {p.rank} is given devices, but its processes ask a "
                    f"fixed {ask.cpus:g} CPUs each and use none: place it on nodes"
                )
            if ask is not None:
                cpus, mem = fixed.get(node, (0.0, 0))
                fixed[node] = (cpus + _ask_cpus(ask), mem + ask.memory_bytes)
            elif p.device_ids:
                devices.setdefault(node, set()).update(p.device_ids)
            else:
                node_only[node] += 1
    nodes = set(devices) | set(node_only) | set(fixed)
    return {
        n: _NodeUse(
            tuple(sorted(devices.get(n, ()))),
            node_only[n],
            *fixed.get(n, (0.0, 0)),
        )
        for n in nodes
    }


def plan_reservation(
    placements: Mapping[str, Sequence[Placement]],
    spec: ClusterSpec,
    overlap: Sequence[frozenset[str]] = (),
    asks: Mapping[str, ProcessAsk] | None = None,
) -> ReservationLayout:
    """Compute the job's bundles and each process's slot.

    Args:
        placements: every component's placements (component name -> one per rank).
        spec: the cluster the placements were resolved against.
        overlap: sets of components whose stages run at the same time; a process's thread
            count divides the node's cores over the processes of its whole set there.
        asks: components whose processes ask a fixed amount (node-only; threads
            ``max(1, int(cpus))``); the others share their bundle in equal parts.

    Returns:
        The layout; bundles are ordered by node, devices first, then the node's CPU bundle.

    Raises:
        PlacementError: when a placement names a node or device the cluster lacks, a fixed-ask
            component is given devices, or a node's CPUs cannot be shared.
    """
    asks = asks or {}
    bundles, parts, job_cpus = _node_bundles(spec, _node_use(placements, spec, asks))
    by_device = {(b.node_rank, b.device): i for i, b in enumerate(bundles) if b.device is not None}
    by_node = {b.node_rank: i for i, b in enumerate(bundles) if b.device is None}

    def home(p: Placement) -> int:
        if p.device_ids:
            return by_device[(p.cluster_node_rank, p.device_ids[0])]
        return by_node[p.cluster_node_rank]

    per_bundle = Counter(home(p) for c, procs in placements.items() if c not in asks for p in procs)
    slots = []
    for component, procs in placements.items():
        ask = asks.get(component)
        together = {component}.union(*(s for s in overlap if component in s))
        per_node = Counter(
            q.cluster_node_rank for c in together if c in placements for q in placements[c]
        )
        for p in procs:
            idx, node = home(p), p.cluster_node_rank
            if ask is not None:
                cpus = _ask_cpus(ask)
                slots.append(
                    ProcessSlot(component, p.rank, idx, cpus, max(1, int(cpus)), ask.memory_bytes)
                )
                continue
            threads = max(1, int(job_cpus[node] + 1e-6) // per_node[node])
            base = bundles[idx].cpus if p.device_ids else parts[node]
            cpus = _floor(base / per_bundle[idx])
            slots.append(ProcessSlot(component, p.rank, idx, max(cpus, RAY_UNIT), threads))
    return ReservationLayout(bundles=tuple(bundles), slots=tuple(slots))
