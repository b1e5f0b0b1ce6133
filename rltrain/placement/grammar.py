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
resource, numbered on from the highest rank so far. Over the whole string the process ranks
must be exactly ``0..N-1``, each used once, and no resource may appear in two parts: processes
that share a resource are written in one part, so sharing is always even. Whitespace around
numbers, ``-``, ``:`` and ``,`` and empty parts (a trailing comma) are ignored, as in RLinf;
numbers are ASCII digits.

Parsing (this module) needs no cluster; resolving a parsed placement needs only the number of
resources it may address, so it is pure and exact. Mapping resource ranks to nodes and devices is
:mod:`rltrain.placement.resources`' job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.errors import PlacementError
from rltrain.placement.types import MAX_DEVICES

ALL = "all"

_SPEC_HELP = "write 'a', 'a-b' (inclusive, a <= b) or 'all', e.g. '0-3:0-7,4'"

# A rank spec: 'all' (any case, as RLinf), or ASCII digits, optionally '-' and ASCII digits.
# Whitespace is allowed around the numbers and the '-' (RLinf strips it), never inside a number.
_SPEC = re.compile(r"\s*(?:(?P<all>all)|(?P<a>[0-9]+)(?:\s*-\s*(?P<b>[0-9]+))?)\s*", re.IGNORECASE)
_DIGITS = frozenset("0123456789")

#: The config key placements are read from, for messages (RLinf's: cluster.component_placement).
SECTION = "component_placement"

#: Processes one component may have: as many as the largest cluster has devices. More is a
#: typo, refused before any list of that length is built.
MAX_PROCESSES = MAX_DEVICES


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
    """One comma-separated part: resources, and optionally the process ranks placed on them.

    Attributes:
        resources: the resource ranks.
        processes: the process ranks, or None for one process per resource.
        text: the part as written, without the whitespace around it (for messages).
    """

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
        text: the placement string exactly as written.
        parts: the parsed parts.
        section: the config key of the mapping it came from, for messages.
    """

    key: str
    components: tuple[str, ...]
    node_groups: tuple[str, ...] | None
    text: str
    parts: tuple[Part, ...]
    section: str = SECTION


def _where(key: str, text: str, section: str = SECTION) -> str:
    return f"{section}[{key!r}]={text!r}"


def _why_not_a_spec(token: str) -> str:
    """Why ``token`` is not a rank spec, naming the character that makes it one."""
    odd = [c for c in token if c.isdigit() and c not in _DIGITS]
    if odd:
        return f"{odd[0]!r} is not an ASCII digit: write ranks with the digits 0-9"
    if "_" in token:
        return "an underscore cannot separate digits: write the number without it"
    if re.search(r"[0-9]\s+[0-9]", token):
        return "whitespace cannot separate digits: remove it, or use ',' between parts"
    return _SPEC_HELP


def parse_rank_spec(
    token: str, key: str, text: str, allow_all: bool = True, section: str = SECTION
) -> RankSpec:
    """Parse ``a``, ``a-b`` or ``all``.

    Numbers are ASCII digits; whitespace around a number or the ``-`` is ignored (as RLinf
    does), whitespace or an underscore inside a number is an error (Python's ``int()`` would
    read ``'1 0'`` as nothing and ``'1_0'`` as ten). ``all`` is accepted in any case.

    Args:
        token: the spec.
        key: the component key, for messages.
        text: the whole placement string as written, for messages.
        allow_all: whether ``all`` is accepted (not for process ranks).
        section: the config key of the whole mapping, for messages.

    Returns:
        The spec.

    Raises:
        PlacementError: for anything else, or ``b < a``.
    """
    m = _SPEC.fullmatch(token)
    if m is None:
        raise PlacementError(
            f"{_where(key, text, section)}: {token.strip()!r} is not a rank spec: "
            f"{_why_not_a_spec(token)}"
        )
    if m["all"] is not None:
        if not allow_all:
            raise PlacementError(
                f"{_where(key, text, section)}: process ranks cannot be 'all'; omit "
                f"':<process ranks>' for one process per resource, or write them as 'a-b'"
            )
        return RankSpec(None, None)
    a = int(m["a"])
    b = int(m["b"]) if m["b"] is not None else a
    if b < a:
        raise PlacementError(
            f"{_where(key, text, section)}: {token.strip()!r} is not a rank range (needs a <= b): "
            f"write '{b}-{a}'; to reorder processes, list parts in the order you want"
        )
    return RankSpec(a, b)


def parse_placement(text: Any, key: str = "?", section: str = SECTION) -> tuple[Part, ...]:
    """Parse a placement string such as ``"0-1:0-3,3-5,7-10:7-14"``.

    As in RLinf, whitespace around parts, ranks, ``:`` and ``-`` is ignored and empty parts
    (a trailing comma, ``" 0-1 , 4-5 ,"``) are skipped.

    Args:
        text: the string (an int is accepted: YAML reads ``actor: 0`` as one).
        key: the component key it belongs to, for messages.
        section: the config key of the whole mapping, for messages.

    Returns:
        Its parts, in order.

    Raises:
        PlacementError: for a string without parts or malformed rank specs; the message
            quotes the string exactly as given.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise PlacementError(
            f"{_where(key, text, section)}: a placement is a string like '0-3' or 'all', or a "
            f"mapping {{node_group: <label>, placement: '0-3'}}; got {type(text).__name__}"
        )
    text = str(text)
    parts = []
    for raw in text.split(","):
        chunk = raw.strip()
        if not chunk:
            continue
        res, sep, proc = chunk.partition(":")
        if sep and ":" in proc:
            raise PlacementError(
                f"{_where(key, text, section)}: part {chunk!r} has more than one ':'; "
                f"a part is resource_ranks[:process_ranks]"
            )
        if sep and not proc.strip():
            raise PlacementError(
                f"{_where(key, text, section)}: part {chunk!r} has no process ranks after ':'"
            )
        resources = parse_rank_spec(res, key, text, section=section)
        processes = parse_rank_spec(proc, key, text, False, section) if sep else None
        parts.append(Part(resources, processes, chunk))
    if not parts:
        raise PlacementError(f"{_where(key, text, section)}: the placement is empty: {_SPEC_HELP}")
    return tuple(parts)


def _labels(value: Any, key: str, section: str = SECTION) -> tuple[str, ...] | None:
    """A ``node_group`` value: one label, ``"a,b"`` or a YAML list, in the order given."""
    if value is None:
        return None
    if isinstance(value, str):
        labels = [s.strip() for s in value.split(",")]
    elif isinstance(value, Sequence):
        labels = [str(s).strip() for s in value]
    else:
        raise PlacementError(
            f"{section}[{key!r}].node_group={value!r}: give a label, 'a,b' or a list"
        )
    if not labels or any(not s for s in labels):
        raise PlacementError(
            f"{section}[{key!r}].node_group={value!r} has an empty label: "
            f"give labels defined in cluster.node_groups, or 'node' / 'cluster'"
        )
    if len(set(labels)) != len(labels):
        raise PlacementError(
            f"{section}[{key!r}].node_group={value!r} lists a group twice: "
            f"list each node group once"
        )
    return tuple(labels)


def parse_entry(key: Any, value: Any, section: str = SECTION) -> Entry:
    """Parse one ``component_placement`` item.

    Args:
        key: ``"actor"`` or ``"actor,rollout"``.
        value: a placement string (or int), or a mapping with ``placement`` and optionally
            ``node_group``.
        section: the config key of the whole mapping, for messages.

    Returns:
        The parsed entry.

    Raises:
        PlacementError: for empty component names, unknown mapping keys, or a bad placement.
    """
    key = str(key)
    names = tuple(n.strip() for n in key.split(","))
    if any(not n for n in names) or len(set(names)) != len(names):
        raise PlacementError(
            f"{section} key {key!r}: list distinct component names separated by "
            f"commas, e.g. 'actor,rollout'"
        )
    groups = None
    if isinstance(value, Mapping) or hasattr(value, "keys"):
        extra = sorted(str(k) for k in value.keys() if k not in ("node_group", "placement"))
        if extra or "placement" not in value:
            raise PlacementError(
                f"{section}[{key!r}]: a mapping takes 'placement' (required) and "
                f"'node_group'; got keys {sorted(str(k) for k in value.keys())}"
            )
        groups = _labels(value.get("node_group"), key, section)
        value = value["placement"]
    parts = parse_placement(value, key, section)
    return Entry(key, names, groups, str(value), parts, section)


def parse_component_placement(mapping: Any, section: str = SECTION) -> tuple[Entry, ...]:
    """Parse a whole ``component_placement`` mapping.

    Args:
        mapping: ``{key: placement}`` as a dict or DictConfig.
        section: its config key (``placement.component_placement``), for messages.

    Returns:
        The entries in the order written.

    Raises:
        PlacementError: for an empty mapping, a component placed twice, or any bad entry.
    """
    if mapping is None or not hasattr(mapping, "items") or len(mapping) == 0:
        raise PlacementError(
            f"{section} is empty or not a mapping: place at least the actor, e.g. {{actor: all}}"
        )
    entries = [parse_entry(k, v, section) for k, v in mapping.items()]
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

    One sharing rule holds over the whole string: processes that share a resource are written
    in one part (``0-1:0-3``), where they share it evenly; two parts never name the same
    resource (``0-1,1-2`` and ``all,0`` are refused, as in RLinf). Parts may list resources in
    any order (``4-7,0-3``: ranks 0-3 on 4-7); a part without process ranks continues after the
    highest rank given so far; explicit process ranks may come in any order if together they
    are exactly ``0..N-1``.

    Args:
        entry: the parsed entry.
        num_resources: how many resources (devices, hardware units or nodes) the entry's node
            groups offer; resource ranks run ``0..num_resources-1``.
        space: a description of those resources, for messages (``"8 accelerators of the
            cluster"``).
        uneven_ok: let processes spread over resources unevenly (as evenly as possible, earlier
            resources taking one more). Only for nodes, where RLinf's documented example needs
            it (``0-1:0-200``: 201 processes on 2 nodes); device sharing stays exact.

    Returns:
        For process rank ``i`` (list index), the resource ranks it uses, ascending.

    Raises:
        PlacementError: for resource ranks beyond ``num_resources``, two parts naming one
            resource, uneven sharing, repeated or missing process ranks, or more than
            :data:`MAX_PROCESSES` processes.
    """
    where = _where(entry.key, entry.text, entry.section)
    if num_resources == 0:
        raise PlacementError(f"{where}: there are no resources to place on ({space})")
    spans: list[tuple[Part, range, range]] = []
    owner: dict[int, Part] = {}
    next_rank = 0
    for part in entry.parts:
        res = part.resources.ranks(num_resources)
        if res.stop > num_resources:
            raise PlacementError(
                f"{where}: part {part.text!r} asks for resource {res.stop - 1}, but there are "
                f"{space}, ranks 0-{num_resources - 1}: lower the range or use 'all', or give "
                f"the cluster more (cluster.devices_per_node, cluster.num_nodes, a node group's "
                f"node_ranks)"
            )
        procs = (
            part.processes.ranks(0) if part.processes else range(next_rank, next_rank + len(res))
        )
        spans.append((part, res, procs))
        next_rank = max(next_rank, procs.stop)
    if next_rank > MAX_PROCESSES or sum(len(p) for _, _, p in spans) > MAX_PROCESSES:
        raise PlacementError(
            f"{where}: process ranks up to {next_rank - 1:,} are beyond any real job (rltrain "
            f"places at most {MAX_PROCESSES:,} processes per component): lower the process "
            f"ranks (after ':')"
        )
    for part, res, _ in spans:
        for r in res:
            first = owner.setdefault(r, part)
            if first is not part:
                raise _overlap(where, first, part, spans, num_resources, space)
    by_rank: dict[int, tuple[int, ...]] = {}
    for part, res, procs in spans:
        for rank, resources in zip(
            procs, _spread(part, len(procs), res, where, uneven_ok), strict=True
        ):
            if rank in by_rank:
                raise PlacementError(
                    f"{where}: process rank {rank} is placed twice (again in part {part.text!r}): "
                    f"each process rank appears once"
                )
            by_rank[rank] = resources
    n = len(by_rank)
    missing = sorted(set(range(n)) - set(by_rank))
    if missing:
        raise PlacementError(
            f"{where}: process ranks must run continuously from 0 to N-1, but ranks "
            f"{_brief(missing)} are missing (ranks given: {_brief(sorted(by_rank))}): "
            f"renumber the process ranks"
        )
    return [by_rank[i] for i in range(n)]


def _count(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _span_text(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def even_alternatives(used: list[int], num_procs: int, num_resources: int) -> list[tuple[str, str]]:
    """Placement strings that place ``num_procs`` processes evenly near the resources ``used``.

    Args:
        used: the resource ranks the refused string named (ascending, at least one).
        num_procs: the processes it asked for.
        num_resources: resources available (ranks ``0..num_resources-1``).

    Returns:
        ``(string, what it means)`` pairs: the processes shared evenly by as many resources as
        possible from the first one used (``0-1:0-3``), then one process per resource when
        that fits (``0-3``), or every resource named once.
    """
    lo = used[0]
    room = min(len(set(used)), num_resources - lo)
    d = max(k for k in range(1, room + 1) if num_procs % k == 0)
    last = num_procs - 1
    out = [
        (
            f"{_span_text(lo, lo + d - 1)}:{_span_text(0, last)}",
            f"{_count(num_procs)}, {num_procs // d} per resource",
        )
    ]
    if num_procs // d == 1:
        out = [(_span_text(lo, lo + d - 1), f"{_count(num_procs)}, one per resource")]
    if num_procs > d and lo + last < num_resources:
        out.append((_span_text(lo, lo + last), f"{_count(num_procs)}, one per resource"))
    elif num_procs > d:
        hi = max(used)
        out.append((_span_text(lo, hi), f"{_count(hi - lo + 1)}, one per resource"))
    return out


def _overlap(
    where: str,
    first: Part,
    again: Part,
    spans: list[tuple[Part, range, range]],
    num_resources: int,
    space: str,
) -> PlacementError:
    """The error for two parts naming the same resource, with even alternatives."""
    a = next(res for p, res, _ in spans if p is first)
    b = next(res for p, res, _ in spans if p is again)
    both = sorted(set(a) & set(b))
    used = sorted({r for _, res, _ in spans for r in res})
    total = sum(len(procs) for _, _, procs in spans)
    alts = "; or ".join(
        f"{text!r} ({what})" for text, what in even_alternatives(used, total, num_resources)
    )
    return PlacementError(
        f"{where}: parts {first.text!r} and {again.text!r} both name resource(s) "
        f"{_brief(both)} (of the {space}). Processes that share a resource are written in "
        f"one part, where they share it evenly; two parts cannot name one resource: e.g. {alts}"
    )


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
