"""Component placements: a whole ``component_placement`` config resolved against a cluster.

:class:`ComponentPlacement` parses the config (RLinf's ``cluster.component_placement`` or
rltrain's ``placement.component_placement``), resolves each entry against the cluster, and gives
each component a strategy and its placements. :class:`HybridComponentPlacement` adds nothing (any
sets of devices); :class:`ModelParallelComponentPlacement` knows the actor and rollout are
model-parallel: it groups rollout devices into engines of ``rollout.tensor_parallel_size``
devices, strides them over the actor's devices when collocated so weight sync stays on-device,
and gives the actor -> rollout rank map used for weight sync.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import rltrain.placement.grammar as grammar
from rltrain.errors import PlacementError
from rltrain.placement.resources import (
    ACCELERATOR,
    NODE,
    ResourceSpace,
    device_keys,
    make_placements,
    resource_space,
)
from rltrain.placement.strategies import (
    ExplicitPlacementStrategy,
    PackedPlacementStrategy,
    PlacementStrategy,
)
from rltrain.placement.tools import with_tool_pool
from rltrain.placement.types import ClusterSpec, Placement


class PlacementMode(enum.Enum):
    """How components use devices: all on the same ones, each on its own, or a mix."""

    COLLOCATED = "collocated"
    DISAGGREGATED = "disaggregated"
    HYBRID = "hybrid"


def _get(obj: Any, path: str, default: Any = None) -> Any:
    """``obj.a.b`` over dicts, DictConfigs and dataclasses; ``default`` when any step is absent."""
    for key in path.split("."):
        if obj is None:
            return default
        if isinstance(obj, Mapping) or (hasattr(obj, "get") and hasattr(obj, "keys")):
            obj = obj.get(key, None)
        else:
            obj = getattr(obj, key, None)
    return default if obj is None else obj


def _mapping_of(config: Any) -> tuple[Any, str]:
    for path in ("placement.component_placement", "cluster.component_placement"):
        value = _get(config, path)
        if value is not None:
            return value, path
    raise PlacementError(
        "the config holds no component placement: set placement.component_placement "
        "(or RLinf's cluster.component_placement), e.g. {actor: all}"
    )


def detect_mode(device_sets: Mapping[str, frozenset[tuple[int, int]]]) -> PlacementMode:
    """Classify components' device sets (node-only components left out by the caller).

    Args:
        device_sets: ``(node, device)`` pairs per component.

    Returns:
        COLLOCATED when every component uses the same devices, DISAGGREGATED when no two share a
        device, HYBRID otherwise.
    """
    sets = [s for s in device_sets.values() if s]
    if len(set(sets)) <= 1:
        return PlacementMode.COLLOCATED
    seen: set[tuple[int, int]] = set()
    for s in sets:
        if seen & s:
            return PlacementMode.HYBRID
        seen |= s
    return PlacementMode.DISAGGREGATED


#: Components whose devices decide a model-parallel (reasoning) layout's mode, as in RLinf's
#: ``ModelParallelComponentPlacement`` (plus the critic, which RLinf's math runs lack): a reward
#: or reference on the rollout's devices does not change it.
MODE_COMPONENTS = ("actor", "rollout", "inference", "critic")


def detect_model_parallel_mode(
    device_sets: Mapping[str, frozenset[tuple[int, int]]],
) -> PlacementMode:
    """RLinf's mode of a model-parallel layout, from actor, rollout, inference and critic.

    Args:
        device_sets: ``(node, device)`` pairs per component (absent or empty: not placed on
            devices; components outside :data:`MODE_COMPONENTS` are ignored).

    Returns:
        COLLOCATED when those components all use the same devices; DISAGGREGATED when no two
        share a device; otherwise HYBRID (some share, some do not: RLinf's hybrid mode, which
        its ``ModelParallelComponentPlacement`` refuses and rltrain runs).
    """
    return detect_mode({c: s for c, s in device_sets.items() if c in MODE_COMPONENTS})


#: Components whose workers hold their whole model on one device (no tensor parallelism): a
#: process may have at most one.
SINGLE_DEVICE_COMPONENTS = ("reference", "critic")


class ComponentPlacement:
    """Parses ``component_placement`` and places every component it names on a cluster.

    Placements are resolved (and so checked) on construction; a bad config raises there.
    """

    def __init__(self, config: Any, cluster: ClusterSpec | Any) -> None:
        """Parse and resolve the placement config.

        Args:
            config: a dict / DictConfig / dataclass holding ``placement.component_placement``
                (rltrain; ``placement.isolate_accelerator`` is honoured) or
                ``cluster.component_placement`` (RLinf).
            cluster: a :class:`ClusterSpec`, or a ``cluster`` config section to build one.

        Raises:
            PlacementError: for any bad entry, naming the component, the string, the offending
                part and what would be valid.
        """
        self.cluster = (
            cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.from_config(cluster)
        )
        self.config = config
        mapping, self.key = _mapping_of(config)
        mapping = with_tool_pool(config, mapping, self.cluster)  # task.env: the default pool
        self.isolate_accelerator = bool(_get(config, "placement.isolate_accelerator", True))
        self._entries = grammar.parse_component_placement(mapping, self.key)
        self._strategies: dict[str, PlacementStrategy] = {}
        self._resolved: dict[str, tuple[ResourceSpace, list[tuple[int, ...]]]] = {}
        self._entry: dict[str, grammar.Entry] = {}
        # Placements and device sets are built on first use, once per strategy: components
        # listed together share one strategy object and so one list of placements.
        self._placements: dict[int, list[Placement]] = {}
        self._devices: dict[int, frozenset[tuple[int, int]]] = {}
        for entry in self._entries:
            self._resolve_entry(entry)

    def _resolve_entry(self, entry: grammar.Entry) -> None:
        where = f"{self.key}[{entry.key!r}]={entry.text!r}"
        try:
            space = resource_space(self.cluster, entry.node_groups)
        except PlacementError as exc:  # an undefined or overlapping node group: name the key
            raise PlacementError(f"{self.key}[{entry.key!r}]: {exc}") from None
        uneven_ok = all(k == NODE for k in set(space.kind))
        per_process = grammar.resolve(entry, len(space), space.describe(), uneven_ok)
        strategy = ExplicitPlacementStrategy(per_process, entry.node_groups, where)
        resolved = strategy.resolve(self.cluster)
        for name in entry.components:
            self._entry[name] = entry
            self._strategies[name] = strategy
            self._resolved[name] = resolved

    def _set(self, name: str, strategy: PlacementStrategy) -> None:
        """Replace one component's strategy (a subclass regrouping its resources)."""
        self._strategies[name] = strategy
        self._resolved[name] = strategy.resolve(self.cluster)

    def _check(self, name: str) -> None:
        if name not in self._strategies:
            raise PlacementError(
                f"component {name!r} is not placed: {self.key} places {self.components}; "
                f"add it, e.g. {name}: all"
            )

    @property
    def components(self) -> list[str]:
        """Component names in the order the config lists them."""
        return [n for e in self._entries for n in e.components]

    @property
    def placement_mode(self) -> PlacementMode:
        """COLLOCATED, DISAGGREGATED or HYBRID, from the devices each component uses."""
        return detect_mode({n: self.device_set(n) for n in self.components})

    def device_set(self, name: str) -> frozenset[tuple[int, int]]:
        """The ``(node, device)`` pairs a component's processes use (empty if node-only).

        Raises:
            PlacementError: for a component the config does not place.
        """
        self._check(name)
        key = id(self._strategies[name])
        if key not in self._devices:
            self._devices[key] = frozenset(device_keys(*self._resolved[name]))
        return self._devices[key]

    def get_world_size(self, component_name: str) -> int:
        """The number of processes of a component.

        Raises:
            PlacementError: for a component the config does not place.
        """
        self._check(component_name)
        return len(self._resolved[component_name][1])

    def get_hardware_ranks(self, component_name: str) -> list[int]:
        """The resource ranks a component uses (in its node groups' resource space), ascending.

        Raises:
            PlacementError: for a component the config does not place.
        """
        self._check(component_name)
        return sorted({r for rs in self._resolved[component_name][1] for r in rs})

    def get_node_groups(self, component_name: str) -> tuple[str, ...] | None:
        """The node-group labels a component's resource ranks count in (None: whole cluster)."""
        self._check(component_name)
        return self._entry[component_name].node_groups

    def get_strategy(self, component_name: str) -> PlacementStrategy:
        """The strategy that places a component (``get_placement(cluster)`` gives its placements).

        Raises:
            PlacementError: for a component the config does not place.
        """
        self._check(component_name)
        return self._strategies[component_name]

    def get_placements(self, component_name: str) -> list[Placement]:
        """A component's placements in rank order (checked on construction, built once).

        Raises:
            PlacementError: for a component the config does not place.
        """
        self._check(component_name)
        strategy = self._strategies[component_name]
        key = id(strategy)
        if key not in self._placements:
            space, per_process = self._resolved[component_name]
            self._placements[key] = make_placements(
                self.cluster, space, per_process, self.isolate_accelerator, repr(strategy)
            )
        return self._placements[key]

    def devices_per_process(self, component_name: str) -> list[int]:
        """How many accelerators each process of a component holds, in rank order.

        Raises:
            PlacementError: for a component the config does not place.
        """
        self._check(component_name)
        space, per_process = self._resolved[component_name]
        kind = space.kind
        return [sum(1 for r in rs if kind[r] == ACCELERATOR) for rs in per_process]


class HybridComponentPlacement(ComponentPlacement):
    """Components on any sets of devices, shared or not (RLinf's embodied runs)."""


class ModelParallelComponentPlacement(ComponentPlacement):
    """Actor and rollout (and inference) as model-parallel groups.

    Its mode is RLinf's (:func:`detect_model_parallel_mode`): collocated when actor, rollout,
    inference and critic all use the same devices, disaggregated when no two of them share a
    device, hybrid when some share and some do not (an rltrain extension).

    * actor and inference: one process per device; their world size must be a multiple of
      ``tensor_parallel_size * pipeline_parallel_size``. Actor rank ``a`` is in data-parallel
      replica ``a // (tp * pp)``.
    * rollout: one engine process per ``rollout.tensor_parallel_size * pipeline_parallel_size``
      devices, so its world size is its number of processes, not devices. A placement that gives
      one process per device (``actor,rollout: all``) is regrouped over the same, contiguous
      devices. When collocated with a wider-TP actor, engine devices are strided by
      ``actor_tp // rollout_tp`` so each rollout shard sits on a device of an actor rank that
      holds it.
    """

    def __init__(self, config: Any, cluster: ClusterSpec | Any) -> None:
        """Parse, resolve, and regroup the model-parallel components.

        Args:
            config: as for :class:`ComponentPlacement`; ``actor``, ``rollout`` and
                ``inference`` sections give ``tensor_parallel_size`` and
                ``pipeline_parallel_size`` (default 1).
            cluster: a :class:`ClusterSpec` or a ``cluster`` config section.

        Raises:
            PlacementError: when actor or rollout is not placed, sizes do not divide the device
                counts, rollout devices are not contiguous, or collocated TP sizes do not nest.
        """
        super().__init__(config, cluster)
        self.sizes = {
            c: (
                int(_get(config, f"{c}.tensor_parallel_size", 1)),
                int(_get(config, f"{c}.pipeline_parallel_size", 1)),
            )
            for c in ("actor", "rollout", "inference")
        }
        for name in ("actor", "rollout"):
            if name not in self._strategies:
                raise PlacementError(
                    f"{self.key} must place {name!r} for a model-parallel run (places "
                    f"{self.components}): add it, e.g. 'actor,rollout: all'"
                )
        for name in ("actor", "inference"):
            if name in self._strategies:
                self._check_one_device_each(name)
        for name in SINGLE_DEVICE_COMPONENTS:
            if name in self._strategies:
                self._check_at_most_one_device(name)
        self._regroup_rollout()

    @property
    def placement_mode(self) -> PlacementMode:
        """RLinf's mode of a model-parallel layout (see :func:`detect_model_parallel_mode`)."""
        return detect_model_parallel_mode(
            {n: self.device_set(n) for n in MODE_COMPONENTS if n in self._strategies}
        )

    def _mp(self, name: str) -> int:
        tp, pp = self.sizes[name]
        return tp * pp

    def _check_one_device_each(self, name: str) -> None:
        tp, pp = self.sizes[name]
        ndev = self.devices_per_process(name)
        bad = [rank for rank, n in enumerate(ndev) if n != 1]
        if bad:
            raise PlacementError(
                f"{self.key}[{self._entry[name].key!r}]={self._entry[name].text!r}: {name} "
                f"runs one process per device, but ranks {bad[:8]} have "
                f"{ndev[bad[0]]} devices: give one device per process"
            )
        if len(ndev) % (tp * pp):
            raise PlacementError(
                f"{name} has {len(ndev)} processes, not a multiple of "
                f"{name}.tensor_parallel_size * {name}.pipeline_parallel_size = {tp}*{pp}: "
                f"change the sizes or place {name} on a multiple of {tp * pp} devices"
            )

    def _check_at_most_one_device(self, name: str) -> None:
        """Refuse a process of ``name`` holding several devices: its worker computes on its
        first device only, so the others would sit idle while the plan splits its memory."""
        ndev = self.devices_per_process(name)
        bad = [rank for rank, n in enumerate(ndev) if n > 1]
        if bad:
            entry = self._entry[name]
            used = self.get_hardware_ranks(name)
            span = str(used[0]) if len(used) == 1 else f"{used[0]}-{used[-1]}"
            raise PlacementError(
                f"{self.key}[{entry.key!r}]={entry.text!r}: a {name} process computes on one "
                f"device, but ranks {bad[:8]} hold {ndev[bad[0]]} devices each: give each "
                f"process one device, e.g. {self.key}.{entry.key}={span} for one process per "
                f"device"
            )

    def _regroup_rollout(self) -> None:
        mp = self._mp("rollout")
        ranks = self._resolved["rollout"][1]
        entry = self._entry["rollout"]
        where = f"{self.key}[{entry.key!r}]={entry.text!r}"
        ndev = set(self.devices_per_process("rollout"))
        if ndev == {mp} or mp == 1:
            if ndev != {mp}:
                raise PlacementError(
                    f"{where}: rollout processes hold {sorted(ndev)} devices but "
                    f"rollout.tensor_parallel_size * pipeline_parallel_size = {mp}: give each "
                    f"rollout process {mp} device(s)"
                )
            return
        flat = [rs[0] for rs in ranks]
        if ndev != {1} or flat != list(range(flat[0], flat[0] + len(flat))):
            raise PlacementError(
                f"{where}: with rollout.tensor_parallel_size * pipeline_parallel_size = {mp}, "
                f"rollout needs one contiguous range of devices, one per process (e.g. 0-7), to "
                f"group into engines of {mp}; got process devices {ranks[:4]}..."
            )
        if len(flat) % mp:
            raise PlacementError(
                f"{where}: rollout has {len(flat)} devices, not a multiple of "
                f"rollout.tensor_parallel_size * pipeline_parallel_size = {mp}: place it on a "
                f"multiple of {mp} devices or change the sizes"
            )
        strategy = PackedPlacementStrategy(
            flat[0], flat[-1], mp, self._rollout_stride(where), entry.node_groups
        )
        self._check_engines_on_one_node(strategy, where, mp)
        self._set("rollout", strategy)

    def _check_engines_on_one_node(
        self, strategy: PackedPlacementStrategy, where: str, mp: int
    ) -> None:
        """Refuse a rollout engine whose devices would straddle nodes (one engine is one
        process, on one node), naming the placement and the engine size."""
        space = self._resolved["rollout"][0]
        for rank, rs in enumerate(strategy.hardware_ranks()):
            nodes = sorted({space.node[r] for r in rs})
            if len(nodes) > 1:
                devices = ", ".join(f"node {space.node[r]} device {space.local[r]}" for r in rs)
                raise PlacementError(
                    f"{where}: rollout.tensor_parallel_size * pipeline_parallel_size = {mp} "
                    f"groups the rollout's devices into engines of {mp}, but engine {rank} would "
                    f"straddle nodes {nodes} ({devices}), and one engine runs on one node: place "
                    f"the rollout so every node's share is a multiple of {mp} devices starting "
                    f"at a node boundary (cluster.devices_per_node a multiple of {mp}), or lower "
                    f"rollout.tensor_parallel_size"
                )

    def _rollout_stride(self, where: str) -> int:
        """Stride rollout engines over a collocated actor's TP groups (1 otherwise)."""
        actor_tp, _ = self.sizes["actor"]
        rollout_tp, rollout_pp = self.sizes["rollout"]
        if self.device_set("rollout") != self.device_set("actor") or rollout_pp != 1:
            return 1
        if actor_tp <= rollout_tp:
            return 1
        if actor_tp % rollout_tp:
            raise PlacementError(
                f"{where}: collocated actor and rollout need actor.tensor_parallel_size "
                f"({actor_tp}) to be a multiple of rollout.tensor_parallel_size ({rollout_tp}) so "
                f"each rollout shard sits on a device of an actor rank that holds it"
            )
        return actor_tp // rollout_tp

    def rollout_rank_map(self) -> dict[int, tuple[int, ...]]:
        """Which rollout ranks each actor rank sends weights to.

        A rollout process whose devices all host actor ranks (collocated, or a hybrid layout
        where rollout sits inside the actor's devices) is fed by the actor ranks on its own
        devices, device by device (CUDA IPC on GPUs). Any other rollout rank ``r`` is fed by every
        rank of actor data-parallel replica ``r % dp`` (a collective over the network), which
        spreads the rollout engines evenly over the replicas.

        Returns:
            ``{actor_rank: (rollout_rank, ...)}`` for every actor rank (empty tuple: sends none).
        """
        actor = self.get_placements("actor")
        mp = self._mp("actor")
        dp = len(actor) // mp
        on_device: dict[tuple[int, int], list[int]] = {}
        for p in actor:
            for d in p.device_ids:
                on_device.setdefault((p.cluster_node_rank, d), []).append(p.rank)
        out: dict[int, list[int]] = {p.rank: [] for p in actor}
        for p in self.get_placements("rollout"):
            keys = [(p.cluster_node_rank, d) for d in p.device_ids]
            if keys and all(k in on_device for k in keys):
                feeders = sorted({a for k in keys for a in on_device[k]})
            else:
                replica = p.rank % dp
                feeders = list(range(replica * mp, (replica + 1) * mp))
            for a in feeders:
                out[a].append(p.rank)
        return {a: tuple(rs) for a, rs in out.items()}
