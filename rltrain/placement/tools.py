"""The tool pool of multi-turn runs (component ``tools``): where its workers go by default, and
whether their CPUs and host memory fit their nodes.

A run with ``task.env`` gets ``tools.pool_size`` tool workers. Unless
``placement.component_placement`` names ``tools`` itself, they are placed on the cluster's
CPU-only nodes (nodes with no accelerator), or on every node when there are none, spread in
contiguous runs of ranks as evenly as the nodes allow (``node_group: node``: a tool worker
reserves no device). Each worker asks Ray for exactly ``tools.cpus_per_worker`` CPUs and
``tools.memory_gib_per_worker`` GiB of Ray's ``memory`` resource; :func:`split_node_cpus` is the
one rule for what a job then takes of a node's CPUs, used by the plan (which refuses a pool that
does not fit) and by the Ray reservation (:mod:`rltrain.scheduler.resources`). Pure: no Ray.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.placement.types import GIB, ClusterSpec, NodeSpec

#: The component's name in placements and plans.
TOOLS = "tools"


def has_tools(run: Any) -> bool:
    """Whether a run has a tool pool: a reasoning run of a text environment (``task.env``)."""
    task = getattr(run, "task", None)
    return getattr(task, "env", None) is not None and getattr(run, "runner", "") == "reasoning"


def default_nodes(cluster: ClusterSpec) -> tuple[int, ...]:
    """The nodes a tool pool goes to by default: the CPU-only ones, or all when none is."""
    cpu = tuple(n.rank for n in cluster.nodes if n.num_devices == 0)
    return cpu or tuple(n.rank for n in cluster.nodes)


def spread(workers: int, nodes: Sequence[int]) -> str:
    """A ``node_group: node`` placement string putting ``workers`` processes on ``nodes``,
    as evenly as possible, in contiguous runs of process ranks (``spread(5, (2, 3))`` is
    ``"2:0-2,3:3-4"``)."""
    parts, start = [], 0
    for i, node in enumerate(nodes):
        count = workers // len(nodes) + (1 if i < workers % len(nodes) else 0)
        if count:
            parts.append(f"{node}:{start}-{start + count - 1}")
            start += count
    return ",".join(parts)


def with_tool_pool(run: Any, mapping: Mapping[str, Any], cluster: ClusterSpec) -> Mapping[str, Any]:
    """``placement.component_placement`` with the tool pool's default entry added when the run
    has a pool the placement does not name (unchanged otherwise)."""
    named = {n.strip() for k in mapping for n in str(k).split(",")}
    if not has_tools(run) or TOOLS in named:
        return mapping
    entry = {"node_group": "node", "placement": spread(run.tools.pool_size, default_nodes(cluster))}
    return {**{str(k): v for k, v in mapping.items()}, TOOLS: entry}


@dataclass(frozen=True)
class NodeCpus:
    """What a job reserves of one node's CPUs.

    Attributes:
        total: CPUs the job reserves on the node (``fixed + rest``).
        fixed: CPUs asked per process by fixed-size processes (tool workers), summed.
        rest: CPUs for the job's other processes there (its device bundles and other
            node-only processes, split evenly); 0 when there are none.
    """

    total: float
    fixed: float
    rest: float


def split_node_cpus(share: float, fixed: float, node_cpus: float, shared: bool) -> NodeCpus:
    """What a job reserves of a node's CPUs when some processes there ask a fixed number.

    The fixed asks (tool workers) are reserved whole. The job's other processes there (when
    ``shared``) get its usual share of the node, shrunk when needed so the sum stays within the
    node's cores; a node with only fixed asks reserves just them, leaving the rest to other jobs.

    Args:
        share: the job's usual CPUs on the node (cores in proportion to the devices it uses).
        fixed: the fixed asks on the node, summed (0: none).
        node_cpus: the node's CPUs.
        shared: whether other processes of the job (devices, node-only ones) are on the node.

    Returns:
        The split; ``rest <= 0`` while ``shared``, or ``total > node_cpus``, means the fixed
        asks do not fit (:meth:`ToolPool.problems` refuses that before Ray).
    """
    if not shared:
        return NodeCpus(total=fixed, fixed=fixed, rest=0.0)
    if fixed <= 0:
        return NodeCpus(total=share, fixed=0.0, rest=share)
    rest = min(share, node_cpus - fixed)
    return NodeCpus(total=fixed + max(rest, 0.0), fixed=fixed, rest=rest)


@dataclass(frozen=True)
class ToolNode:
    """The tool workers of one node and what they need of it.

    Attributes:
        node: the node's rank.
        workers: tool workers placed there.
        cpus: the CPUs they need (workers x ``tools.cpus_per_worker``).
        memory_bytes: the host memory they need (workers x ``tools.memory_gib_per_worker``).
        node_cpus: the node's CPUs (``cluster.cpus_per_node``, this machine's cores before a
            local Ray starts, Ray's count after).
        node_memory_bytes: the node's host memory (None: unknown, not checked).
        shared: whether other processes of the job are on the node too (they need some of
            its CPUs: see :func:`split_node_cpus`).
    """

    node: int
    workers: int
    cpus: float
    memory_bytes: int
    node_cpus: float
    node_memory_bytes: int | None
    shared: bool = False


@dataclass(frozen=True)
class ToolPool:
    """The planned tool pool.

    Attributes:
        workers: tool worker actors in all.
        cpus_per_worker: ``tools.cpus_per_worker``.
        memory_bytes_per_worker: ``tools.memory_gib_per_worker`` in bytes.
        concurrency: calls one worker runs at once (``tools.concurrency``).
        timeout_s: the per-call limit (``tools.timeout_s``).
        nodes: per node with workers, what they need and what it has.
    """

    workers: int
    cpus_per_worker: float
    memory_bytes_per_worker: int
    concurrency: int
    timeout_s: float
    nodes: tuple[ToolNode, ...]

    def problems(self) -> list[str]:
        """Every node whose tool workers need more CPUs or host memory than it has, as
        messages naming the keys and the fixes."""
        out = []
        for n in self.nodes:
            split = split_node_cpus(n.node_cpus, n.cpus, n.node_cpus, n.shared)
            if n.shared and n.cpus <= n.node_cpus + 1e-9 and split.rest <= 1e-9:
                out.append(
                    f"the tool pool leaves no CPU of node {n.node} for the job's other "
                    f"processes there: {n.workers} tool worker(s) x tools.cpus_per_worker="
                    f"{self.cpus_per_worker:g} reserve all {n.node_cpus:g} CPUs "
                    f"(cluster.cpus_per_node). Fix: lower tools.pool_size or "
                    f"tools.cpus_per_worker, or place the pool on other nodes "
                    f"(placement.component_placement.tools)"
                )
            if split.total > n.node_cpus + 1e-9:
                out.append(
                    f"the tool pool does not fit node {n.node}'s CPUs: {n.workers} tool "
                    f"worker(s) x tools.cpus_per_worker={self.cpus_per_worker:g} need "
                    f"{n.cpus:g} CPUs, the node has {n.node_cpus:g} (cluster.cpus_per_node). "
                    f"Fix: lower tools.pool_size or tools.cpus_per_worker, raise "
                    f"cluster.cpus_per_node, or spread the pool over more nodes "
                    f"(placement.component_placement.tools)"
                )
            if n.node_memory_bytes is not None and n.memory_bytes > n.node_memory_bytes:
                out.append(
                    f"the tool pool does not fit node {n.node}'s host memory: {n.workers} tool "
                    f"worker(s) x tools.memory_gib_per_worker="
                    f"{self.memory_bytes_per_worker / GIB:g} need {n.memory_bytes / GIB:.2f} "
                    f"GiB, the node has {n.node_memory_bytes / GIB:.2f} GiB "
                    f"(cluster.host_memory_gib). Fix: lower tools.pool_size or "
                    f"tools.memory_gib_per_worker, or spread the pool over more nodes "
                    f"(placement.component_placement.tools)"
                )
        return out


def node_cpus(run: Any, node: NodeSpec) -> float:
    """A node's CPUs for sizing the pool: the discovered or configured count; before a local
    Ray starts with ``cluster.cpus_per_node`` null, this machine's cores."""
    configured = getattr(getattr(run, "cluster", None), "cpus_per_node", None)
    if node.ray_node_id is None and configured is None:
        return float(os.cpu_count() or 1)
    return node.num_cpus


def tool_pool(
    run: Any, cluster: ClusterSpec, node_ranks: Sequence[int], others: Sequence[int] = ()
) -> ToolPool:
    """Size a planned pool.

    Args:
        run: the run config (its ``tools`` section).
        cluster: the cluster planned for.
        node_ranks: the node of each tool worker, in rank order.
        others: the nodes of the job's other processes.

    Returns:
        The pool with each node's needs and capacity.
    """
    t = run.tools
    per_memory = int(t.memory_gib_per_worker * GIB)
    nodes = []
    for rank in sorted(set(node_ranks)):
        count = sum(1 for r in node_ranks if r == rank)
        spec = cluster.nodes[rank]
        nodes.append(
            ToolNode(
                node=rank,
                workers=count,
                cpus=count * t.cpus_per_worker,
                memory_bytes=count * per_memory,
                node_cpus=node_cpus(run, spec),
                node_memory_bytes=spec.host_memory_bytes,
                shared=rank in set(others),
            )
        )
    return ToolPool(
        workers=len(node_ranks),
        cpus_per_worker=t.cpus_per_worker,
        memory_bytes_per_worker=per_memory,
        concurrency=t.concurrency,
        timeout_s=t.timeout_s,
        nodes=tuple(nodes),
    )
