"""Resource spaces: the numbered resources a placement addresses, and turning them into Placements.

A *resource space* is what resource ranks count in a placement string or a strategy: the
accelerators of the cluster (or of the listed node groups, concatenated in the order listed, each
group's nodes in the order its ``node_ranks`` give), the non-accelerator hardware of a node group
that declares some (robots), or the nodes themselves (the reserved ``node`` group, or nodes
without accelerators).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from rltrain.errors import ConfigError, PlacementError
from rltrain.placement.types import ClusterSpec, NodeSpec, Placement

ACCELERATOR = "accelerator"
HARDWARE = "hardware"
NODE = "node"


@dataclass(frozen=True)
class ResourceSpace:
    """Resources numbered ``0..len-1``, each on one node.

    Attributes:
        labels: the node-group labels the space was built from, in order.
        node: the cluster node rank of each resource.
        local: the resource's local index on its node (device id, hardware unit, or 0 for a node).
        kind: ``accelerator``, ``hardware`` or ``node`` per resource.
        hardware_type: the hardware name per resource (None for accelerators and nodes).
        label: the node-group label each resource came from.
    """

    labels: tuple[str, ...]
    node: tuple[int, ...]
    local: tuple[int, ...]
    kind: tuple[str, ...]
    hardware_type: tuple[str | None, ...]
    label: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.node)

    def describe(self) -> str:
        """E.g. ``"16 accelerators of node group 'a800'"``, for error messages."""
        kinds = sorted(set(self.kind))
        what = (
            "/".join(f"{k}s" if k != HARDWARE else "hardware units" for k in kinds) or "resources"
        )
        where = (
            "the cluster"
            if self.labels == ("cluster",)
            else f"node group {','.join(self.labels)!r}"
        )
        return f"{len(self)} {what} of {where}"


def _nodes(cluster: ClusterSpec) -> dict[int, NodeSpec]:
    return {n.rank: n for n in cluster.nodes}


@lru_cache(maxsize=64)
def resource_space(
    cluster: ClusterSpec, labels: tuple[str, ...] | None = None, nodes_only: bool = False
) -> ResourceSpace:
    """Number the resources of ``labels`` (None: the whole cluster).

    Args:
        cluster: the cluster.
        labels: node-group labels, concatenated in order; ``node`` gives the cluster's nodes.
        nodes_only: count nodes even where the groups have accelerators or hardware
            (``NodePlacementStrategy``).

    Returns:
        The space.

    Raises:
        PlacementError: for an unknown label, or listed groups that share a node (its devices
            would be numbered twice).
    """
    labels = labels or ("cluster",)
    _check_disjoint(cluster, labels)
    nodes = _nodes(cluster)
    node: list[int] = []
    local: list[int] = []
    kind: list[str] = []
    hw: list[str | None] = []
    lab: list[str] = []
    for label in labels:
        ranks, hw_type, hw_count = _group_of(cluster, label, nodes)
        as_nodes = nodes_only or label == NODE
        if not as_nodes and hw_type is None and not any(nodes[r].num_devices for r in ranks):
            as_nodes = True  # RLinf: without accelerators, resource ranks are node ranks
        for r in ranks:
            if as_nodes:
                items, k, t = (0,), NODE, None
            elif hw_type is not None:
                items, k, t = range(hw_count), HARDWARE, hw_type
            else:
                items, k, t = range(nodes[r].num_devices), ACCELERATOR, None
            for i in items:
                node.append(r)
                local.append(i)
                kind.append(k)
                hw.append(t)
                lab.append(label)
    return ResourceSpace(labels, tuple(node), tuple(local), tuple(kind), tuple(hw), tuple(lab))


def _group_of(
    cluster: ClusterSpec, label: str, nodes: dict[int, NodeSpec]
) -> tuple[tuple[int, ...], str | None, int]:
    """``(node ranks, hardware type, hardware count)`` of a node group (``node``: every node)."""
    if label == NODE:
        return tuple(sorted(nodes)), None, 0
    try:
        g = cluster.group(label)
    except ConfigError as exc:
        raise PlacementError(str(exc)) from None
    return g.node_ranks, g.hardware_type, g.hardware_count


def _check_disjoint(cluster: ClusterSpec, labels: tuple[str, ...]) -> None:
    """Refuse node groups listed together that share a node: the shared node's resources would
    get two resource ranks each, so two processes could share a device unseen."""
    if len(labels) < 2:
        return
    owner: dict[int, str] = {}
    nodes = _nodes(cluster)
    for label in labels:
        try:
            ranks = _group_of(cluster, label, nodes)[0]
        except PlacementError:
            continue  # resource_space reports the unknown label
        for r in ranks:
            first = owner.setdefault(r, label)
            if first != label:
                raise PlacementError(
                    f"node_group {','.join(labels)!r} lists node groups "
                    f"{_where_defined(cluster, first)} and {_where_defined(cluster, label)}, "
                    f"which both hold node {r}: groups listed together must not share nodes "
                    f"(the node's devices would get two resource ranks each); list one of them, "
                    f"or define one group holding each node once"
                )


def _where_defined(cluster: ClusterSpec, label: str) -> str:
    """``'a' (cluster.node_groups[0].node_ranks=[0, 1])``, or ``'node' (every node)``."""
    for i, g in enumerate(cluster.node_groups):
        if g.label == label:
            return f"{label!r} (cluster.node_groups[{i}].node_ranks={list(g.node_ranks)})"
    return f"{label!r} (every node)"


def make_placements(
    cluster: ClusterSpec,
    space: ResourceSpace,
    per_process: Sequence[Sequence[int]],
    isolate_accelerator: bool,
    where: str,
) -> list[Placement]:
    """Build one :class:`Placement` per process from its resource ranks in ``space``.

    Args:
        cluster: the cluster the space was built from.
        space: the resource space.
        per_process: for process ``i``, its resource ranks (all on one node, of one kind).
        isolate_accelerator: whether a process sees only its own accelerators.
        where: the component or strategy, for messages.

    Returns:
        The placements, in process-rank order.

    Raises:
        PlacementError: for a rank outside the space, or a process whose resources straddle
            nodes or mix kinds of hardware.
    """
    nodes = _nodes(cluster)
    s_node, s_local, s_kind, s_hw, s_label = (
        space.node,
        space.local,
        space.kind,
        space.hardware_type,
        space.label,
    )
    first = check_processes(space, per_process, where)
    counts: dict[int, int] = {}
    for r0 in first:
        n = s_node[r0]
        counts[n] = counts.get(n, 0) + 1
    # Per node, computed once: its spec, its index in this placement, device names.
    info: dict[int, tuple[int, str, tuple[str, ...]]] = {}
    for n in counts:
        info[n] = (
            len(info),
            nodes[n].accelerator_type,
            tuple(map(str, range(nodes[n].num_devices))),
        )
    seen = dict.fromkeys(counts, 0)
    iso = isolate_accelerator
    # Placement is a frozen dataclass without __post_init__; filling __dict__ directly builds
    # the same object ~4x faster than __init__, which matters at 10^5 processes (the plan_scale
    # benchmark). The fields set here must stay in step with Placement's (a test checks it).
    new = object.__new__
    out = []
    append = out.append
    for rank, rs in enumerate(per_process):
        r0 = first[rank]
        n = s_node[r0]
        index, accel_type, names = info[n]
        local_rank = seen[n]
        seen[n] = local_rank + 1
        k = s_kind[r0]
        if len(rs) == 1:
            locals_ = (s_local[r0],)
        else:
            locals_ = tuple(s_local[r] for r in rs)
        if k == ACCELERATOR:
            visible = tuple(names[i] for i in locals_) if iso else names
            accel_rank = locals_[0]
        else:
            # As in RLinf, a process placed on a node or on other hardware (a robot) sees its
            # node's accelerators, isolated or not: a simulator renders on them. It reserves
            # none of them (device_ids stays empty), so the plan, the Ray reservation and the
            # residency ledger count it on no device. These are the node's device numbers; the
            # reservation shows each as the id Ray gives that GPU (e.g. 2,3 under SLURM).
            visible = names
            accel_rank = 0 if names else -1
            if k == NODE:
                locals_ = ()
        p = new(Placement)
        p.__dict__.update(
            {
                "rank": rank,
                "cluster_node_rank": n,
                "placement_node_rank": index,
                "local_accelerator_rank": accel_rank,
                "accelerator_type": accel_type,
                "local_rank": local_rank,
                "local_world_size": counts[n],
                "visible_accelerators": visible,
                "isolate_accelerator": iso,
                "local_hardware_ranks": locals_,
                "node_group_label": s_label[r0],
                "hardware_type": s_hw[r0],
            }
        )
        append(p)
    return out


def check_processes(
    space: ResourceSpace, per_process: Sequence[Sequence[int]], where: str
) -> list[int]:
    """Check every process's resource ranks: in the space, and all on one node, of one kind.

    Args:
        space: the resource space.
        per_process: for process ``i``, its resource ranks.
        where: the component or strategy, for messages.

    Returns:
        Each process's first resource rank.

    Raises:
        PlacementError: for an empty process, a rank outside the space, or a process whose
            resources straddle nodes or mix kinds of hardware.
    """
    size = len(space)
    first: list[int] = []
    for rank, rs in enumerate(per_process):
        if not rs:
            raise PlacementError(f"{where}: process {rank} has no resources")
        if len(rs) > 1:
            _check_one_node(space, rs, rank, where)
        elif not 0 <= rs[0] < size:
            raise PlacementError(
                f"{where}: process {rank} asks for resource {rs[0]}, but there are "
                f"{space.describe()}, ranks 0-{size - 1}: lower the ranks"
            )
        first.append(rs[0])
    return first


def device_keys(space: ResourceSpace, per_process: Sequence[Sequence[int]]) -> set[tuple[int, int]]:
    """The ``(node, local device)`` pairs the processes' accelerator resources cover."""
    node, local, kind = space.node, space.local, space.kind
    return {(node[r], local[r]) for rs in per_process for r in rs if kind[r] == ACCELERATOR}


def _check_one_node(space: ResourceSpace, rs: Sequence[int], rank: int, where: str) -> None:
    if len(set(rs)) != len(rs):
        raise PlacementError(f"{where}: process {rank} lists a resource twice: {list(rs)}")
    size = len(space)
    bad = [r for r in rs if not 0 <= r < size]
    if bad:
        raise PlacementError(
            f"{where}: process {rank} asks for resources {bad}, but there are "
            f"{space.describe()}, ranks 0-{size - 1}: lower the ranks"
        )
    nodes = {space.node[r] for r in rs}
    kinds = {(space.kind[r], space.hardware_type[r]) for r in rs}
    if len(nodes) > 1:
        raise PlacementError(
            f"{where}: process {rank} would use resources {list(rs)}, which straddle nodes "
            f"{sorted(nodes)}; one process's devices must all be on one node: align the ranges "
            f"to node boundaries or use fewer devices per process"
        )
    if len(kinds) > 1:
        raise PlacementError(
            f"{where}: process {rank} would use resources {list(rs)} of different kinds "
            f"{sorted(str(k) for k in kinds)}; one process uses one kind of hardware"
        )
