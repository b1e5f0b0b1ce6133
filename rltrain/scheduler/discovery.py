"""Turn the nodes a live Ray cluster reports into a :class:`ClusterSpec` with stable node ranks.

Pure: the input is the list ``ray.nodes()`` returns (plain dicts), so ordering, device counting
and node-group matching are tested without Ray.

Node ranks (``cluster.node_order``):

- ``head_first`` (default): the head node is rank 0, the others follow by IP address (numeric
  order), then by Ray node id. Stable as long as the set of nodes does not change.
- ``ip``: every node by IP address, then node id (the head is not special).
- ``label``: each node declares its rank with the Ray node label ``rltrain.io/node-rank``
  (``ray start --labels='{"rltrain.io/node-rank": "1"}'``); every node must carry a distinct one.

Node groups come from ``cluster.node_groups`` (by rank) and from the Ray node label
``rltrain.io/node-group`` (a comma-separated list of group labels). When both name a group they
must agree, otherwise the run stops with an error naming both.

A job the sweep launcher runs beside others gets a device slice (:data:`SLICE_ENV`): its plan's
node ``r`` runs on the cluster node the launcher admitted it on. :func:`apply_node_map` gives the
job a spec whose node ``r`` is that cluster node (its Ray node id, devices and groups), so the
job reserves its devices there.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.config.engine_checks import simulated_device_gib
from rltrain.errors import ConfigError, ResourceError
from rltrain.placement.types import GIB, ClusterSpec, NodeGroup, NodeSpec

RANK_LABEL = "rltrain.io/node-rank"
GROUP_LABEL = "rltrain.io/node-group"
#: Set by rltrain on nodes whose devices it declared (simulated); value in GiB.
MEMORY_LABEL = "rltrain.io/device-memory-gib"
NODE_ORDERS = ("head_first", "ip", "label")
#: Set by the rltrain sweep launcher in each job's driver: a JSON list of
#: ``{"job": [node, device], "cluster": [node, device]}`` pairs placing the job's planned devices
#: on the cluster (``hydra_plugins/rltrain_launcher/_slices.py`` writes it).
SLICE_ENV = "RLTRAIN_DEVICE_SLICE"


@dataclass(frozen=True)
class DiscoveredNode:
    """One alive node as Ray reports it.

    Attributes:
        node_id: Ray's node id.
        ip: the node manager's address.
        is_head: whether this is the head node.
        num_cpus: CPUs Ray schedules on the node.
        num_gpus: GPUs Ray schedules on the node (real or declared).
        real_gpus: whether Ray detected the GPUs (an ``accelerator_type:*`` resource) rather than
            having them declared on a CPU node.
        labels: Ray node labels.
        memory_bytes: the memory Ray schedules tasks and actors against (0: not reported).
    """

    node_id: str
    ip: str
    is_head: bool
    num_cpus: float
    num_gpus: int
    real_gpus: bool
    labels: Mapping[str, str]
    memory_bytes: int = 0

    @classmethod
    def from_ray(cls, entry: Mapping[str, Any]) -> DiscoveredNode:
        """Build from one element of ``ray.nodes()``."""
        res = entry.get("Resources", {}) or {}
        labels = dict(entry.get("Labels", {}) or {})
        real = any(k.startswith("accelerator_type:") for k in res) or (
            "ray.io/accelerator-type" in labels
        )
        return cls(
            node_id=str(entry["NodeID"]),
            ip=str(entry.get("NodeManagerAddress", "")),
            is_head="node:__internal_head__" in res,
            num_cpus=float(res.get("CPU", 0.0)),
            num_gpus=int(res.get("GPU", 0)),
            real_gpus=real,
            labels=labels,
            memory_bytes=int(res.get("memory", 0) or 0),
        )


def _ip_key(ip: str) -> tuple[int, int | str]:
    try:
        return (0, int(ipaddress.ip_address(ip)))
    except ValueError:
        return (1, ip)


def order_nodes(nodes: Sequence[DiscoveredNode], node_order: str) -> list[DiscoveredNode]:
    """Return ``nodes`` in rank order (index = node rank).

    Args:
        nodes: alive nodes, in any order.
        node_order: ``head_first``, ``ip`` or ``label`` (see the module docstring).

    Returns:
        The nodes sorted by rank.

    Raises:
        ConfigError: for an unknown order, or labels missing, duplicated or not ``0..n-1``.
    """
    if node_order not in NODE_ORDERS:
        raise ConfigError(
            f"cluster.node_order={node_order!r} is not valid: choose one of {list(NODE_ORDERS)}"
        )
    by_ip = sorted(nodes, key=lambda n: (_ip_key(n.ip), n.node_id))
    if node_order == "ip":
        return by_ip
    if node_order == "head_first":
        return [n for n in by_ip if n.is_head] + [n for n in by_ip if not n.is_head]
    ranks: dict[int, DiscoveredNode] = {}
    for n in nodes:
        raw = n.labels.get(RANK_LABEL)
        try:
            r = int(raw) if raw is not None else None
        except ValueError:
            r = None
        if r is None:
            raise ConfigError(
                f"cluster.node_order='label' but node {n.node_id[:12]} ({n.ip}) has "
                f"{RANK_LABEL}={raw!r}: start every node with "
                f'--labels=\'{{"{RANK_LABEL}": "<rank>"}}\' or use node_order=head_first'
            )
        if r in ranks:
            raise ConfigError(
                f"cluster.node_order='label': nodes {ranks[r].node_id[:12]} and "
                f"{n.node_id[:12]} both have {RANK_LABEL}={r}: give each node its own rank"
            )
        ranks[r] = n
    if sorted(ranks) != list(range(len(nodes))):
        raise ConfigError(
            f"cluster.node_order='label': node ranks {sorted(ranks)} must be 0..{len(nodes) - 1}"
        )
    return [ranks[r] for r in range(len(nodes))]


def _label_groups(nodes: Sequence[DiscoveredNode]) -> dict[str, tuple[int, ...]]:
    """Group label -> node ranks, from the ``rltrain.io/node-group`` label of ranked nodes."""
    out: dict[str, list[int]] = {}
    for rank, n in enumerate(nodes):
        for label in filter(None, (s.strip() for s in n.labels.get(GROUP_LABEL, "").split(","))):
            out.setdefault(label, []).append(rank)
    return {k: tuple(v) for k, v in out.items()}


def match_node_groups(
    configured: Sequence[NodeGroup], nodes: Sequence[DiscoveredNode]
) -> tuple[NodeGroup, ...]:
    """Merge node groups from config with those the nodes' Ray labels declare.

    Args:
        configured: groups parsed from ``cluster.node_groups`` (ranks already range-checked).
        nodes: the nodes in rank order.

    Returns:
        The configured groups, then label-only groups in label order.

    Raises:
        ConfigError: when a configured group's ranks differ from the nodes labelled with it.
    """
    labelled = _label_groups(nodes)
    groups = list(configured)
    for i, g in enumerate(configured):
        if g.label in labelled and set(labelled[g.label]) != set(g.node_ranks):
            raise ConfigError(
                f"cluster.node_groups[{i}] (label {g.label!r}) lists nodes "
                f"{list(g.node_ranks)} but the nodes labelled {GROUP_LABEL}={g.label} are "
                f"{list(labelled[g.label])}: fix node_ranks or the nodes' labels"
            )
    known = {g.label for g in configured}
    groups.extend(NodeGroup(label, ranks) for label, ranks in sorted(labelled.items()))
    return tuple(g for i, g in enumerate(groups) if i < len(configured) or g.label not in known)


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def job_nodes(entries: Sequence[Mapping[str, Any]], cluster_cfg: Any) -> list[DiscoveredNode]:
    """The nodes a job uses: the first ``cluster.num_nodes`` alive nodes in rank order.

    Args:
        entries: ``ray.nodes()`` (dead nodes are skipped).
        cluster_cfg: the ``cluster`` section (``num_nodes``, ``node_order``).

    Returns:
        The job's nodes; index = node rank.

    Raises:
        ResourceError: when Ray has fewer alive nodes than ``cluster.num_nodes``.
        ConfigError: for bad node order labels.
    """
    alive = [DiscoveredNode.from_ray(e) for e in entries if e.get("Alive", e.get("alive"))]
    want = int(_get(cluster_cfg, "num_nodes", 1))
    if len(alive) < want:
        raise ResourceError(
            f"cluster.num_nodes={want} but the Ray cluster has {len(alive)} alive node(s): "
            f"start more nodes (ray start --address=...) or lower cluster.num_nodes"
        )
    return order_nodes(alive, str(_get(cluster_cfg, "node_order", "head_first")))[:want]


def build_spec(
    entries: Sequence[Mapping[str, Any]],
    cluster_cfg: Any,
    device_memory_bytes: Mapping[str, int] | None = None,
) -> ClusterSpec:
    """Build the job's :class:`ClusterSpec` from ``ray.nodes()`` and the ``cluster`` config.

    Args:
        entries: ``ray.nodes()`` (dead nodes are skipped).
        cluster_cfg: the ``cluster`` section (``num_nodes``, ``node_order``, ``node_groups``,
            ``device_memory_gib``, ``cpus_per_node``).
        device_memory_bytes: measured memory per device by node id (real GPUs), capped by
            ``device_memory_gib`` when set; nodes missing here use their
            ``rltrain.io/device-memory-gib`` label, else the config (4 GiB when null).

    Returns:
        The first ``cluster.num_nodes`` nodes in rank order, with their devices and groups.

    Raises:
        ResourceError: when Ray has fewer alive nodes than ``cluster.num_nodes``.
        ConfigError: for bad node order labels or node groups that disagree with labels.
    """
    ranked = job_nodes(entries, cluster_cfg)
    measured = device_memory_bytes or {}
    configured = _get(cluster_cfg, "device_memory_gib", None)
    default_mem = int(simulated_device_gib(configured) * GIB)
    cap = int(float(configured) * GIB) if configured is not None else None
    cpus = _get(cluster_cfg, "cpus_per_node")
    host_gib = _get(cluster_cfg, "host_memory_gib")
    nodes = []
    for rank, n in enumerate(ranked):
        label_mem = n.labels.get(MEMORY_LABEL)
        mem = measured.get(n.node_id) or (int(float(label_mem) * GIB) if label_mem else default_mem)
        if n.node_id in measured and cap is not None:
            mem = min(mem, cap)  # on GPUs the configured value caps what the plan may use
        accel = "none" if n.num_gpus == 0 else ("cuda" if n.real_gpus else "sim")
        nodes.append(
            NodeSpec(
                rank=rank,
                num_devices=n.num_gpus,
                device_memory_bytes=mem,
                accelerator_type=accel,
                num_cpus=min(float(cpus), n.num_cpus) if cpus else n.num_cpus,
                host_memory_bytes=_host_bytes(host_gib, n.memory_bytes),
                ray_node_id=n.node_id,
                ip=n.ip,
            )
        )
    # Parse and range-check configured groups with the same code the pure planner uses.
    parsed = ClusterSpec.from_config(
        {
            "num_nodes": len(nodes),
            "devices_per_node": [n.num_devices for n in nodes],
            "node_groups": _get(cluster_cfg, "node_groups") or [],
        }
    )
    groups = match_node_groups(parsed.node_groups, ranked)
    return ClusterSpec(nodes=tuple(nodes), node_groups=groups)


def _host_bytes(configured_gib: Any, reported: int) -> int | None:
    """A node's host memory for the plan: what Ray reports, capped by
    ``cluster.host_memory_gib``; None when neither says."""
    cap = int(float(configured_gib) * GIB) if configured_gib is not None else None
    if reported and cap is not None:
        return min(reported, cap)
    return reported or cap


def slice_node_map(text: str | None) -> dict[int, int]:
    """Job node rank -> cluster node rank, from the launcher's :data:`SLICE_ENV` value.

    Args:
        text: the variable's value (None or empty: the job runs where it was planned).

    Returns:
        The map (empty when ``text`` is empty or the slice holds no device).

    Raises:
        ConfigError: when ``text`` is not a slice, or maps one job node onto two cluster nodes.
    """
    if not text:
        return {}
    out: dict[int, int] = {}
    try:
        for item in json.loads(text):
            job, node = int(item["job"][0]), int(item["cluster"][0])
            if out.setdefault(job, node) != node:
                raise ValueError(f"job node {job} is on cluster nodes {out[job]} and {node}")
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ConfigError(
            f"{SLICE_ENV}={text!r} is not a device slice ({exc}): only the rltrain sweep "
            f"launcher sets it; unset it to run the job where its plan puts it"
        ) from None
    return out


def node_permutation(node_map: Mapping[int, int], num_nodes: int) -> list[int]:
    """Where each of a job's nodes runs: ``out[job_rank]`` is a cluster node rank.

    Job nodes the map names go where it says; the others (nodes holding no device of the job)
    keep their own rank when no mapped node took it, else take the lowest rank left, so every
    job node has a cluster node of its own.

    Args:
        node_map: job node rank -> cluster node rank (:func:`slice_node_map`).
        num_nodes: ``cluster.num_nodes``.

    Returns:
        A permutation of ``range(num_nodes)``.

    Raises:
        ConfigError: when the map names a node outside ``0..num_nodes-1`` or one cluster node
            twice.
    """
    ranks = range(num_nodes)
    bad = {j: c for j, c in node_map.items() if j not in ranks or c not in ranks}
    if bad or len(set(node_map.values())) != len(node_map):
        raise ConfigError(
            f"{SLICE_ENV} maps job nodes onto cluster nodes {dict(node_map)}, which is not a "
            f"one-to-one map within cluster.num_nodes={num_nodes}: every job of a sweep must "
            f"share one cluster config; unset {SLICE_ENV} outside the sweep launcher"
        )
    taken = set(node_map.values())
    spare = iter(sorted(set(ranks) - taken - {j for j in ranks if j not in node_map}))
    out = []
    for job in ranks:
        if job in node_map:
            out.append(node_map[job])
        elif job not in taken:
            out.append(job)
        else:
            out.append(next(spare))
    return out


def apply_node_map(spec: ClusterSpec, node_map: Mapping[int, int]) -> ClusterSpec:
    """The spec a job placed by its launcher slice sees: its node ``r`` is cluster node
    ``permutation[r]`` (that node's Ray id, address, devices), and node groups name job ranks.

    Args:
        spec: the discovered cluster, in cluster ranks.
        node_map: job node rank -> cluster node rank (:func:`slice_node_map`).

    Returns:
        ``spec`` itself when every job node stays on its own rank, else the renumbered spec.

    Raises:
        ConfigError: for a map that is not one-to-one within the cluster's nodes.
    """
    perm = node_permutation(node_map, spec.num_nodes)
    if perm == list(range(spec.num_nodes)):
        return spec
    job_rank = {c: j for j, c in enumerate(perm)}
    nodes = tuple(dataclasses.replace(spec.nodes[c], rank=j) for j, c in enumerate(perm))
    groups = tuple(
        dataclasses.replace(g, node_ranks=tuple(job_rank[c] for c in g.node_ranks))
        for g in spec.node_groups
    )
    return ClusterSpec(nodes=nodes, node_groups=groups)
