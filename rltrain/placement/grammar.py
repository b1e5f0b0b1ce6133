"""The ``component_placement`` grammar (RLinf's, with the same meaning), parsed and resolved.

A placement config maps component names to placements::

    actor,rollout: all                       # both components share one placement
    reference: 0-3:0-7                       # 8 processes on resources 0-3, two per resource
    env:  {node_group: robot, placement: "0-3:0-7"}
    agent: {node_group: node, placement: "0-1:0-200,2-3:201-511"}

A placement string is ``part[,part...]`` with ``part = resource_ranks[:process_ranks]`` and each
rank spec one of ``a``, ``a-b`` (inclusive) or ``all`` (resources only). Processes spread evenly
over the part's resources (``0-3:0-7``: two per resource) or resources split evenly over the
processes (``0-7:0-3``: two per process). A part without process ranks gives one process per
resource, numbered on from the previous part. Over the whole string the process ranks must be
exactly ``0..N-1``, each used once.

Parsing (this module) needs no cluster; resolving a parsed placement needs only the number of
resources it may address, so it is pure and exact. Mapping resource ranks to nodes and devices is
:mod:`rltrain.placement.resources`' job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.errors import PlacementError

ALL = "all"

_SPEC_HELP = "write 'a', 'a-b' (inclusive, a <= b) or 'all', e.g. '0-3:0-7,4'"


@dataclass(frozen=True)
class RankSpec:
    """One rank spec of a part: ``a``, ``a-b`` or ``all`` (``start``/``end`` None)."""

    start: int | None
    end: int | None

    @property
    def is_all(self) -> bool:
        return self.start is None

    def ranks(self, total: int) -> range:
        """The ranks this spec names, ``all`` meaning ``0..total-1``."""
        if self.start is None or self.end is None:
            return range(total)
        return range(self.start, self.end + 1)

    def __str__(self) -> str:
        if self.start is None:
            return ALL
        return str(self.start) if self.start == self.end else f"{self.start}-{self.end}"


@dataclass(frozen=True)
class Part:
    """One comma-separated part: resources, and optionally the process ranks placed on them."""

    resources: RankSpec
    processes: RankSpec | None
    text: str


@dataclass(frozen=True)
class Entry:
    """One key of ``component_placement`` after parsing.

    Attributes:
        key: the key as written (``"actor,rollout"``), for error messages.
        components: the component names the key lists; they share this placement.
        node_groups: the node-group labels whose resources are concatenated, in the order given,
            or None for the whole cluster.
        text: the placement string as written.
        parts: the parsed parts.
    """

    key: str
    components: tuple[str, ...]
    node_groups: tuple[str, ...] | None
    text: str
    parts: tuple[Part, ...]


def _where(key: str, text: str) -> str:
    return f"component_placement[{key!r}]={text!r}"


def parse_rank_spec(token: str, key: str, text: str, allow_all: bool = True) -> RankSpec:
    """Parse ``a``, ``a-b`` or ``all``.

    Args:
        token: the spec.
        key: the component key, for messages.
        text: the whole placement string, for messages.
        allow_all: whether ``all`` is accepted (not for process ranks).

    Returns:
        The spec.

    Raises:
        PlacementError: for anything else, or ``b < a``.
    """
    token = token.strip()
    if token == ALL:
        if not allow_all:
            raise PlacementError(
                f"{_where(key, text)}: process ranks cannot be 'all'; omit ':<process ranks>' "
                f"for one process per resource, or write them as 'a-b'"
            )
        return RankSpec(None, None)
    lo, sep, hi = token.partition("-")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise PlacementError(
            f"{_where(key, text)}: {token!r} is not a rank spec: {_SPEC_HELP}"
        ) from None
    if a < 0 or b < a:
        raise PlacementError(
            f"{_where(key, text)}: {token!r} is not a rank range (needs 0 <= a <= b): {_SPEC_HELP}"
        )
    return RankSpec(a, b)


def parse_placement(text: Any, key: str = "?") -> tuple[Part, ...]:
    """Parse a placement string such as ``"0-1:0-3,3-5,7-10:7-14"``.

    Args:
        text: the string (an int is accepted: YAML reads ``actor: 0`` as one).
        key: the component key it belongs to, for messages.

    Returns:
        Its parts, in order.

    Raises:
        PlacementError: for an empty string, empty parts or malformed rank specs.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise PlacementError(
            f"{_where(key, text)}: a placement is a string like '0-3' or 'all', or a mapping "
            f"{{node_group: <label>, placement: '0-3'}}; got {type(text).__name__}"
        )
    text = str(text).replace(" ", "")
    if not text:
        raise PlacementError(f"{_where(key, text)}: the placement is empty: {_SPEC_HELP}")
    parts = []
    for chunk in text.split(","):
        if not chunk:
            raise PlacementError(f"{_where(key, text)}: an empty part between commas")
        res, sep, proc = chunk.partition(":")
        if sep and ":" in proc:
            raise PlacementError(
                f"{_where(key, text)}: part {chunk!r} has more than one ':'; "
                f"a part is resource_ranks[:process_ranks]"
            )
        if sep and not proc:
            raise PlacementError(
                f"{_where(key, text)}: part {chunk!r} has no process ranks after ':'"
            )
        resources = parse_rank_spec(res, key, text)
        processes = parse_rank_spec(proc, key, text, allow_all=False) if sep else None
        parts.append(Part(resources, processes, chunk))
    return tuple(parts)


def _labels(value: Any, key: str) -> tuple[str, ...] | None:
    """A ``node_group`` value: one label, ``"a,b"`` or a YAML list, in the order given."""
    if value is None:
        return None
    if isinstance(value, str):
        labels = [s.strip() for s in value.split(",")]
    elif isinstance(value, Sequence):
        labels = [str(s).strip() for s in value]
    else:
        raise PlacementError(
            f"component_placement[{key!r}].node_group={value!r}: give a label, 'a,b' or a list"
        )
    if not labels or any(not s for s in labels):
        raise PlacementError(
            f"component_placement[{key!r}].node_group={value!r} has an empty label: "
            f"give labels defined in cluster.node_groups, or 'node' / 'cluster'"
        )
    if len(set(labels)) != len(labels):
        raise PlacementError(
            f"component_placement[{key!r}].node_group={value!r} lists a group twice: "
            f"list each node group once"
        )
    return tuple(labels)


def parse_entry(key: Any, value: Any) -> Entry:
    """Parse one ``component_placement`` item.

    Args:
        key: ``"actor"`` or ``"actor,rollout"``.
        value: a placement string (or int), or a mapping with ``placement`` and optionally
            ``node_group``.

    Returns:
        The parsed entry.

    Raises:
        PlacementError: for empty component names, unknown mapping keys, or a bad placement.
    """
    key = str(key)
    names = tuple(n.strip() for n in key.split(","))
    if any(not n for n in names) or len(set(names)) != len(names):
        raise PlacementError(
            f"component_placement key {key!r}: list distinct component names separated by "
            f"commas, e.g. 'actor,rollout'"
        )
    groups = None
    if isinstance(value, Mapping) or hasattr(value, "keys"):
        extra = sorted(str(k) for k in value.keys() if k not in ("node_group", "placement"))
        if extra or "placement" not in value:
            raise PlacementError(
                f"component_placement[{key!r}]: a mapping takes 'placement' (required) and "
                f"'node_group'; got keys {sorted(str(k) for k in value.keys())}"
            )
        groups = _labels(value.get("node_group"), key)
        value = value["placement"]
    parts = parse_placement(value, key)
    return Entry(key, names, groups, str(value).replace(" ", ""), parts)


def parse_component_placement(mapping: Any) -> tuple[Entry, ...]:
    """Parse a whole ``component_placement`` mapping.

    Args:
        mapping: ``{key: placement}`` as a dict or DictConfig.

    Returns:
        The entries in the order written.

    Raises:
        PlacementError: for an empty mapping, a component placed twice, or any bad entry.
    """
    if mapping is None or not hasattr(mapping, "items") or len(mapping) == 0:
        raise PlacementError(
            "component_placement is empty or not a mapping: place at least the actor, "
            "e.g. {actor: all}"
        )
    entries = [parse_entry(k, v) for k, v in mapping.items()]
    seen: dict[str, str] = {}
    for e in entries:
        for name in e.components:
            if name in seen:
                raise PlacementError(
                    f"component {name!r} is placed twice (keys {seen[name]!r} and {e.key!r}): "
                    f"place each component once; list components together to share a placement"
                )
            seen[name] = e.key
    return tuple(entries)


def resolve(
    entry: Entry, num_resources: int, space: str, uneven_ok: bool = False
) -> list[tuple[int, ...]]:
    """Resolve a parsed placement into the resource ranks of each process.

    Args:
        entry: the parsed entry.
        num_resources: how many resources (devices, hardware units or nodes) the entry's node
            groups offer; resource ranks run ``0..num_resources-1``.
        space: a description of those resources, for messages (``"8 accelerators of the
            cluster"``).
        uneven_ok: let processes spread over resources unevenly (as evenly as possible, earlier
            resources taking one more). RLinf's own node example needs it (``0-1:0-200``: 201
            processes on 2 nodes); device sharing stays exact.

    Returns:
        For process rank ``i`` (list index), the resource ranks it uses, ascending.

    Raises:
        PlacementError: for resource ranks beyond ``num_resources``, uneven sharing, repeated
            or missing process ranks.
    """
    where = _where(entry.key, entry.text)
    by_rank: dict[int, tuple[int, ...]] = {}
    next_rank = 0
    for part in entry.parts:
        res = part.resources.ranks(num_resources)
        if num_resources == 0:
            raise PlacementError(f"{where}: there are no resources to place on ({space})")
        if res.stop > num_resources:
            raise PlacementError(
                f"{where}: part {part.text!r} asks for resource {res.stop - 1}, but there are "
                f"{space}, ranks 0-{num_resources - 1}: lower the range or use 'all'"
            )
        procs = (
            part.processes.ranks(0) if part.processes else range(next_rank, next_rank + len(res))
        )
        for rank, resources in zip(
            procs, _spread(part, len(procs), res, where, uneven_ok), strict=True
        ):
            if rank in by_rank:
                raise PlacementError(
                    f"{where}: process rank {rank} is placed twice (again in part {part.text!r}): "
                    f"each process rank appears once"
                )
            by_rank[rank] = resources
        next_rank = procs.stop
    n = len(by_rank)
    missing = sorted(set(range(n)) - set(by_rank))
    if missing:
        raise PlacementError(
            f"{where}: process ranks must run continuously from 0 to N-1, but ranks "
            f"{_brief(missing)} are missing (ranks given: {_brief(sorted(by_rank))}): "
            f"renumber the process ranks"
        )
    return [by_rank[i] for i in range(n)]


def _spread(
    part: Part, num_procs: int, res: range, where: str, uneven_ok: bool
) -> list[tuple[int, ...]]:
    """Resources per process for one part: shared evenly, or split evenly."""
    nres = len(res)
    if num_procs >= nres:
        per, extra = divmod(num_procs, nres)
        if extra and not uneven_ok:
            raise PlacementError(
                f"{where}: part {part.text!r} puts {num_procs} processes on {nres} resources, "
                f"which do not share evenly: make the process count a multiple of {nres}"
            )
        out: list[tuple[int, ...]] = []
        for i, r in enumerate(res):
            out.extend([(r,)] * (per + (1 if i < extra else 0)))
        return out
    per, extra = divmod(nres, num_procs)
    if extra:
        raise PlacementError(
            f"{where}: part {part.text!r} splits {nres} resources over {num_procs} processes, "
            f"which is not even: use a process count that divides {nres}"
        )
    return [tuple(res[i * per : (i + 1) * per]) for i in range(num_procs)]


def _brief(ranks: list[int], limit: int = 8) -> str:
    text = ", ".join(map(str, ranks[:limit]))
    return f"[{text}{', ...' if len(ranks) > limit else ''}]"
