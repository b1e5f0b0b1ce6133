"""The records placement works with: a cluster description and one process's placement.

Pure data: no Ray, no torch. A :class:`ClusterSpec` comes from the ``cluster`` config group
(:meth:`ClusterSpec.from_config`) or, at run time, from a live Ray cluster (the scheduler builds
one); placement is resolved against it the same way in both cases.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rltrain.config.ranks import parse_ranks
from rltrain.errors import ConfigError

GIB = 1024**3

#: Labels the grammar reserves: ``cluster`` is every node, ``node`` addresses node ranks only.
RESERVED_LABELS = ("cluster", "node")

#: Sizes beyond any real cluster: a plan is refused at once rather than built for hours.
MAX_NODES = 100_000
MAX_DEVICES = 100_000
#: 1 PiB per device: more is a typo, and the memory arithmetic would lose meaning.
MAX_DEVICE_BYTES = 1024**5


def _count(value: Any, key: str, minimum: int) -> int:
    """A whole number of nodes or devices from config (``1e3`` from YAML is 1000).

    Raises:
        ConfigError: for a value that is not a whole number >= ``minimum``.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not a whole number: give an integer >= {minimum}")
    try:
        number = float(value)
        whole = int(number) if math.isfinite(number) else None
    except (TypeError, ValueError, OverflowError):
        whole = None
    if whole is None or whole != number or whole < minimum:
        raise ConfigError(
            f"{key}={value!r} is not a whole number >= {minimum}: set {key} to an integer "
            f">= {minimum}"
        )
    return whole


def _getter(obj: Any):
    """``get(key, default)`` over a mapping (dict, DictConfig) or an object with attributes."""
    if isinstance(obj, Mapping) or hasattr(obj, "get") and not hasattr(obj, "__dataclass_fields__"):
        return obj.get
    return lambda key, default=None: getattr(obj, key, default)


@dataclass(frozen=True)
class NodeSpec:
    """One node of the cluster.

    Attributes:
        rank: the node's rank in the cluster (0 is the head on a live cluster).
        num_devices: accelerators on the node (0 for a CPU-only node).
        device_memory_bytes: memory of each accelerator.
        accelerator_type: ``"cuda"`` for real GPUs, ``"sim"`` for simulated devices, ``"none"``.
        num_cpus: CPUs Ray may schedule on the node.
        host_memory_bytes: host memory the plan sizes CPU components (tool workers) against;
            None: unknown (not checked).
        ray_node_id: Ray's node id, set when built from a live cluster.
        ip: the node's address.
    """

    rank: int
    num_devices: int
    device_memory_bytes: int = 4 * GIB
    accelerator_type: str = "sim"
    num_cpus: float = 1.0
    host_memory_bytes: int | None = None
    ray_node_id: str | None = None
    ip: str = "127.0.0.1"


@dataclass(frozen=True)
class NodeGroup:
    """A labelled, ordered set of nodes, optionally with non-accelerator hardware.

    Attributes:
        label: the name placements use (``node_group: <label>``).
        node_ranks: cluster node ranks in the order given in config; hardware and accelerator
            ranks within the group follow this order.
        hardware_type: a non-accelerator hardware name (e.g. ``robot``), or None.
        hardware_count: units of that hardware per node.
    """

    label: str
    node_ranks: tuple[int, ...]
    hardware_type: str | None = None
    hardware_count: int = 0


@dataclass(frozen=True)
class ClusterSpec:
    """The nodes a job may use, their devices, and the node groups defined over them."""

    nodes: tuple[NodeSpec, ...]
    node_groups: tuple[NodeGroup, ...] = field(default=())

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_devices(self) -> int:
        return sum(n.num_devices for n in self.nodes)

    def group(self, label: str) -> NodeGroup:
        """Return the node group called ``label`` (``cluster`` is every node).

        Raises:
            ConfigError: when no group has that label.
        """
        if label == "cluster":
            return NodeGroup("cluster", tuple(n.rank for n in self.nodes))
        for g in self.node_groups:
            if g.label == label:
                return g
        known = ["cluster", "node", *(g.label for g in self.node_groups)]
        raise ConfigError(
            f"node group {label!r} is not defined: define it in cluster.node_groups "
            f"or use one of {known}"
        )

    @classmethod
    def from_config(cls, cluster: Any) -> ClusterSpec:
        """Build a spec from the ``cluster`` config section (a dataclass, DictConfig or dict).

        Args:
            cluster: holds ``num_nodes``, ``devices_per_node`` (int or one per node),
                ``device_memory_gib`` and optionally ``node_groups`` and ``cpus_per_node``.

        Returns:
            The cluster described by the config, with simulated devices unless
            ``simulate_devices`` is false (then ``cuda``).

        Raises:
            ConfigError: for inconsistent sizes, node groups naming nodes that do not exist or
                one node twice, or a hardware count below 1.
        """
        get = _getter(cluster)
        num_nodes = _count(get("num_nodes", 1), "cluster.num_nodes", minimum=1)
        if num_nodes > MAX_NODES:
            raise ConfigError(
                f"cluster.num_nodes={num_nodes:,} is beyond any real cluster (rltrain plans at "
                f"most {MAX_NODES:,} nodes): lower cluster.num_nodes"
            )
        per_node = get("devices_per_node", 0)
        if isinstance(per_node, Sequence) and not isinstance(per_node, str):
            devices = [
                _count(x, f"cluster.devices_per_node[{i}]", minimum=0)
                for i, x in enumerate(per_node)
            ]
            if len(devices) != num_nodes:
                raise ConfigError(
                    f"cluster.devices_per_node has {len(devices)} entries but "
                    f"cluster.num_nodes={num_nodes}: give one entry per node, or a single int "
                    f"for all nodes"
                )
            total = sum(devices)
        else:
            per = _count(per_node, "cluster.devices_per_node", minimum=0)
            total = per * num_nodes
            if total <= MAX_DEVICES:
                devices = [per] * num_nodes
        if total > MAX_DEVICES:
            raise ConfigError(
                f"cluster.devices_per_node={per_node!r} on cluster.num_nodes={num_nodes:,} makes "
                f"{total:,} devices, beyond any real cluster (rltrain plans at most "
                f"{MAX_DEVICES:,}): lower cluster.devices_per_node or cluster.num_nodes"
            )
        accel = "sim" if get("simulate_devices", True) else "cuda"
        # a cluster of CPU nodes only has no device memory to read
        memory = _device_memory(get("device_memory_gib", None), accel if total else "sim")
        cpus = get("cpus_per_node", None)
        host = _host_memory(get("host_memory_gib", None))
        nodes = tuple(
            NodeSpec(
                rank=r,
                num_devices=d,
                device_memory_bytes=memory,
                accelerator_type=accel if d else "none",
                num_cpus=float(cpus) if cpus else 1.0,
                host_memory_bytes=host,
            )
            for r, d in enumerate(devices)
        )
        groups = []
        for i, g in enumerate(get("node_groups", None) or []):
            gget = _getter(g)
            key = f"cluster.node_groups[{i}]"
            label = str(gget("label"))
            if label in RESERVED_LABELS:
                raise ConfigError(f"{key}.label={label!r} is reserved: choose another label")
            ranks = parse_ranks(gget("node_ranks"), f"{key}.node_ranks")
            bad = [r for r in ranks if not 0 <= r < num_nodes]
            if bad:
                raise ConfigError(
                    f"{key}.node_ranks names nodes {bad}, but the cluster has nodes "
                    f"0-{num_nodes - 1}: fix the ranks or cluster.num_nodes"
                )
            twice = sorted(r for r, n in Counter(ranks).items() if n > 1)
            if twice:
                # one node listed twice would number its devices under two resource ranks,
                # letting two processes share a device the placement says is not shared
                raise ConfigError(
                    f"{key}.node_ranks={gget('node_ranks')!r} lists nodes {twice} more than "
                    f"once: list each node once"
                )
            hw = gget("hardware")
            hw_get = _getter(hw)
            groups.append(
                NodeGroup(
                    label=label,
                    node_ranks=ranks,
                    hardware_type=str(hw_get("type")) if hw else None,
                    hardware_count=_count(hw_get("count", 1), f"{key}.hardware.count", 1)
                    if hw
                    else 0,
                )
            )
        return cls(nodes=nodes, node_groups=tuple(groups))


@dataclass(frozen=True)
class Placement:
    """Where one process of a component runs (RLinf's ``Placement`` fields and meanings).

    Attributes:
        rank: the process's rank within its component (0..world_size-1).
        cluster_node_rank: the node's rank in the cluster.
        placement_node_rank: the node's index among the nodes this placement uses.
        local_accelerator_rank: the first local device id the process uses or, for a process
            placed on a node or on other hardware, the node's first device (-1 for none).
        accelerator_type: ``cuda``, ``sim`` or ``none``.
        local_rank: the process's rank among this component's processes on its node.
        local_world_size: this component's processes on the node.
        visible_accelerators: device ids (as strings) to expose, e.g. via CUDA_VISIBLE_DEVICES:
            its own devices when isolated; when not, every device of its node from a strategy
            alone, and in a plan every device the plan uses on that node (what the run's
            reservation exposes); every device of its node for a process placed on a node or
            on other hardware (as in RLinf: seen, not reserved).
        isolate_accelerator: whether an accelerator process sees only its own devices (then its
            devices are renumbered from 0 inside the process).
        local_hardware_ranks: the local hardware (device, robot, ...) ranks the process uses.
        node_group_label: the node group the resources were drawn from.
        hardware_type: the non-accelerator hardware (e.g. ``robot``) that
            ``local_hardware_ranks`` count, or None when they count accelerators (or, for a
            node-only process, are empty).
    """

    rank: int
    cluster_node_rank: int
    placement_node_rank: int
    local_accelerator_rank: int
    accelerator_type: str
    local_rank: int
    local_world_size: int
    visible_accelerators: tuple[str, ...]
    isolate_accelerator: bool
    local_hardware_ranks: tuple[int, ...]
    node_group_label: str | None = None
    hardware_type: str | None = None

    @property
    def device_ids(self) -> tuple[int, ...]:
        """Local accelerator ids the process reserves (empty for node-only and hardware
        processes, which see their node's devices without reserving them)."""
        if self.hardware_type is not None or self.accelerator_type not in ("cuda", "sim"):
            return ()
        return self.local_hardware_ranks


def _host_memory(configured: Any) -> int | None:
    """Bytes of host memory per node: ``cluster.host_memory_gib``, or (null) this machine's
    physical memory, each node assumed alike; None where the OS does not say."""
    if configured is not None:
        try:
            gib = float(configured)
        except (TypeError, ValueError):
            gib = -1.0
        if not gib > 0:
            raise ConfigError(
                f"cluster.host_memory_gib={configured!r} is not a memory size: give GiB > 0, "
                f"or null for this machine's memory"
            )
        return int(gib * GIB)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _device_memory(configured: Any, accel: str) -> int:
    """The bytes each device holds for the plan made before Ray starts.

    Simulated devices have the configured capacity (4 GiB when null). GPUs have the configured
    value, or when null the local GPUs' memory (``nvidia-smi``). After Ray starts, every GPU
    node's own memory is measured and the configured value caps it
    (:func:`rltrain.scheduler.discovery.build_spec`).

    Raises:
        ConfigError: a value that is not a device memory, or GPUs planned with no value and
            no local GPU to read one from.
    """
    from rltrain.config.engine_checks import local_gpu_memory_bytes, simulated_device_gib

    if configured is not None:
        try:
            gib = float(configured)
        except (TypeError, ValueError):
            gib = math.nan
        if not math.isfinite(gib) or gib <= 0 or gib * GIB > MAX_DEVICE_BYTES:
            raise ConfigError(
                f"cluster.device_memory_gib={configured!r} is not a device memory: give a "
                f"positive number of GiB, e.g. 80, or null"
            )
    if accel == "sim":
        return int(simulated_device_gib(None if configured is None else gib) * GIB)
    if configured is None:
        local = local_gpu_memory_bytes()
        if local is None:
            raise ConfigError(
                "cluster.device_memory_gib=null with cluster.simulate_devices=false, and this "
                "machine shows no GPU to read the memory from (nvidia-smi): set "
                "cluster.device_memory_gib to the cluster's GPU memory in GiB (e.g. 80) so the "
                "plan is checked before Ray starts"
            )
        return local
    return int(gib * GIB)
