"""Placement strategies: which resources each process of a group gets.

Every strategy turns a :class:`~rltrain.placement.types.ClusterSpec` into one
:class:`~rltrain.placement.types.Placement` per process with ``get_placement``. Resource ranks are
counted in a resource space (:mod:`rltrain.placement.resources`): the cluster's accelerators, or
those of the given node groups concatenated in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rltrain.errors import PlacementError
from rltrain.placement.resources import (
    ResourceSpace,
    check_processes,
    make_placements,
    resource_space,
)
from rltrain.placement.types import ClusterSpec, Placement


def _labels(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """Node-group labels: None, ``"a"``, ``"a,b"`` or a list, kept in the order given."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    labels = tuple(s.strip() for s in items if s.strip())
    return labels or None


def _int(name: str, value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlacementError(f"{where}: {name}={value!r} must be an integer >= {minimum}")
    return value


class PlacementStrategy:
    """Base of the strategies: subclasses define :meth:`resolve`."""

    def resolve(self, cluster: ClusterSpec) -> tuple[ResourceSpace, list[tuple[int, ...]]]:
        """The resource space and each process's resource ranks in it, checked.

        Raises:
            PlacementError: when the strategy asks for resources the cluster does not have, or
                one process's resources straddle nodes.
        """
        raise NotImplementedError

    def get_placement(
        self, cluster: ClusterSpec, isolate_accelerator: bool = True
    ) -> list[Placement]:
        """Place the group's processes on ``cluster``.

        Args:
            cluster: the cluster to place on.
            isolate_accelerator: whether each process sees only its own accelerators.

        Returns:
            One placement per process, in rank order.

        Raises:
            PlacementError: when the strategy asks for resources the cluster does not have.
        """
        space, per_process = self.resolve(cluster)
        return make_placements(cluster, space, per_process, isolate_accelerator, repr(self))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class PackedPlacementStrategy(PlacementStrategy):
    """Processes close-packed on hardware ranks ``start..end``, each taking
    ``num_hardware_per_process`` of them, optionally strided.

    Ranks are taken in blocks of ``num_hardware_per_process * stride``; within a block, process
    ``j`` (``0 <= j < stride``) takes ranks ``block + j + k * stride`` for
    ``k < num_hardware_per_process``. So ``(0, 3, num_hardware_per_process=2, stride=2)`` gives
    processes on ``[0, 2]`` and ``[1, 3]``. A process whose ranks would straddle a node boundary
    is an error (never a device that does not exist).
    """

    def __init__(
        self,
        start_hardware_rank: int,
        end_hardware_rank: int,
        num_hardware_per_process: int = 1,
        stride: int = 1,
        node_group: str | Sequence[str] | None = None,
    ) -> None:
        """Check and keep the parameters.

        Args:
            start_hardware_rank: first hardware rank (in the cluster or the node groups).
            end_hardware_rank: last hardware rank, inclusive.
            num_hardware_per_process: hardware each process holds.
            stride: distance between one process's ranks.
            node_group: label, ``"a,b"`` or list of labels whose hardware ranks are concatenated
                in order; None for the whole cluster.

        Raises:
            PlacementError: for negative or reversed ranks, or a range that does not split
                into whole blocks of ``num_hardware_per_process * stride``.
        """
        where = "PackedPlacementStrategy"
        self.start_hardware_rank = _int("start_hardware_rank", start_hardware_rank, where, 0)
        self.end_hardware_rank = _int("end_hardware_rank", end_hardware_rank, where, 0)
        self.num_hardware_per_process = _int(
            "num_hardware_per_process", num_hardware_per_process, where, 1
        )
        self.stride = _int("stride", stride, where, 1)
        self.node_group = _labels(node_group)
        count = self.end_hardware_rank - self.start_hardware_rank + 1
        block = self.num_hardware_per_process * self.stride
        if count < 1 or count % block:
            raise PlacementError(
                f"{self!r}: the range {self.start_hardware_rank}-{self.end_hardware_rank} holds "
                f"{max(count, 0)} ranks, which is not a positive multiple of "
                f"num_hardware_per_process * stride = {block}: adjust the range or the sizes"
            )

    def hardware_ranks(self) -> list[tuple[int, ...]]:
        """The hardware ranks of each process, in rank order (no cluster needed)."""
        n, s = self.num_hardware_per_process, self.stride
        out = []
        for block in range(self.start_hardware_rank, self.end_hardware_rank + 1, n * s):
            for j in range(s):
                out.append(tuple(block + j + k * s for k in range(n)))
        return out

    def resolve(self, cluster: ClusterSpec) -> tuple[ResourceSpace, list[tuple[int, ...]]]:
        space = resource_space(cluster, self.node_group)
        if self.end_hardware_rank >= len(space):
            raise PlacementError(
                f"{self!r}: end_hardware_rank={self.end_hardware_rank}, but there are "
                f"{space.describe()}, ranks 0-{len(space) - 1}: lower end_hardware_rank"
            )
        per_process = self.hardware_ranks()
        check_processes(space, per_process, repr(self))
        return space, per_process


class FlexiblePlacementStrategy(PlacementStrategy):
    """Each process on an explicit list of hardware ranks.

    Ranks are sorted within each process, and processes by their first rank (stable), so
    ``[[3], [0, 1]]`` gives rank 0 on ``[0, 1]`` and rank 1 on ``[3]``. Two processes may list the
    same rank: they share it.
    """

    def __init__(
        self,
        hardware_ranks_list: Sequence[Sequence[int]],
        node_group_label: str | Sequence[str] | None = None,
    ) -> None:
        """Check and keep the ranks.

        Args:
            hardware_ranks_list: for each process, its hardware ranks (in the cluster, or in the
                node groups when ``node_group_label`` is given); on one node, no repeats.
            node_group_label: label, ``"a,b"`` or list of labels; None for the whole cluster.

        Raises:
            PlacementError: for an empty list, an empty or repeating inner list, or non-int ranks.
        """
        where = "FlexiblePlacementStrategy"
        if not hardware_ranks_list:
            raise PlacementError(
                f"{where}: hardware_ranks_list is empty: give one list per process"
            )
        ranks = []
        for i, rs in enumerate(hardware_ranks_list):
            rs = [_int(f"hardware_ranks_list[{i}] entry", r, where, 0) for r in rs]
            if not rs or len(set(rs)) != len(rs):
                raise PlacementError(
                    f"{where}: hardware_ranks_list[{i}]={rs!r} must be non-empty without repeats"
                )
            ranks.append(tuple(sorted(rs)))
        self.hardware_ranks_list = sorted(ranks, key=lambda rs: rs[0])
        self.node_group_label = _labels(node_group_label)

    def resolve(self, cluster: ClusterSpec) -> tuple[ResourceSpace, list[tuple[int, ...]]]:
        space = resource_space(cluster, self.node_group_label)
        check_processes(space, self.hardware_ranks_list, repr(self))
        return space, list(self.hardware_ranks_list)


class NodePlacementStrategy(PlacementStrategy):
    """One process per listed node rank, without accelerators (CPU-only workers).

    Node ranks are sorted; a rank listed twice places two processes on that node.
    """

    def __init__(
        self, node_ranks: Sequence[int], node_group_label: str | Sequence[str] | None = None
    ) -> None:
        """Check and keep the node ranks.

        Args:
            node_ranks: cluster node ranks, or ranks within the node groups (their nodes
                concatenated in order) when ``node_group_label`` is given.
            node_group_label: label, ``"a,b"`` or list of labels; None for the whole cluster.

        Raises:
            PlacementError: for an empty list or non-int ranks.
        """
        where = "NodePlacementStrategy"
        if not node_ranks:
            raise PlacementError(f"{where}: node_ranks is empty: give one node rank per process")
        self.node_ranks = sorted(_int("node rank", r, where, 0) for r in node_ranks)
        self.node_group_label = _labels(node_group_label)

    def resolve(self, cluster: ClusterSpec) -> tuple[ResourceSpace, list[tuple[int, ...]]]:
        space = resource_space(cluster, self.node_group_label, nodes_only=True)
        per_process = [(r,) for r in self.node_ranks]
        check_processes(space, per_process, repr(self))
        return space, per_process


class ExplicitPlacementStrategy(PlacementStrategy):
    """Process ``i`` on exactly the resource ranks at position ``i``, in the order given.

    What a ``component_placement`` string resolves to: unlike
    :class:`FlexiblePlacementStrategy` it does not reorder processes, so
    ``"4-7,0-3"`` keeps ranks 0-3 on resources 4-7. Resources are counted as in the grammar:
    accelerators, a node group's hardware, or nodes where there are neither.
    """

    def __init__(
        self,
        per_process: Sequence[Sequence[int]],
        node_group_label: str | Sequence[str] | None = None,
        where: str = "ExplicitPlacementStrategy",
    ) -> None:
        """Keep the resource ranks.

        Args:
            per_process: for each process rank, its resource ranks.
            node_group_label: label(s) whose resources are concatenated; None for the cluster.
            where: the config key this came from, for messages.
        """
        self.per_process = [tuple(rs) for rs in per_process]
        self.node_group_label = _labels(node_group_label)
        self.where = where

    def __repr__(self) -> str:
        return f"ExplicitPlacementStrategy({self.where}, {len(self.per_process)} processes)"

    def resolve(self, cluster: ClusterSpec) -> tuple[ResourceSpace, list[tuple[int, ...]]]:
        space = resource_space(cluster, self.node_group_label)
        check_processes(space, self.per_process, self.where)
        return space, self.per_process

    def get_placement(
        self, cluster: ClusterSpec, isolate_accelerator: bool = True
    ) -> list[Placement]:
        space, per_process = self.resolve(cluster)
        return make_placements(cluster, space, per_process, isolate_accelerator, self.where)
