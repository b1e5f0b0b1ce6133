"""Properties over random clusters and placement strings (hypothesis).

Every accepted layout: process ranks are exactly 0..N-1, every device exists, sharing is even
(a device's processes all hold just that device, and a process's devices carry equal loads), no
resource is named by two parts, and node processes see their node's devices and reserve none.
"""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from placement_helpers import make_cluster

from rltrain.errors import PlacementError
from rltrain.placement import (
    HybridComponentPlacement,
    NodePlacementStrategy,
    PackedPlacementStrategy,
)
from rltrain.placement.types import ClusterSpec, Placement

clusters = st.lists(st.integers(1, 8), min_size=1, max_size=4).map(make_cluster)
# Nodes may have no devices at all (CPU or robot nodes).
mixed_clusters = st.lists(st.integers(0, 8), min_size=1, max_size=4).map(make_cluster)


def global_rank(cluster: ClusterSpec, node: int, device: int) -> int:
    return sum(n.num_devices for n in cluster.nodes[:node]) + device


def node_of(cluster: ClusterSpec, rank: int) -> int:
    """The node holding the cluster's hardware rank ``rank`` (nodes in order)."""
    first = 0
    for i, node in enumerate(cluster.nodes):
        if rank < first + node.num_devices:
            return i
        first += node.num_devices
    raise AssertionError(f"rank {rank} is past the cluster's {first} devices")


def straddles(cluster: ClusterSpec, process_ranks: list[list[int]]) -> bool:
    """Whether any process's hardware ranks lie on two nodes (computed by hand)."""
    return any(len({node_of(cluster, r) for r in ranks}) > 1 for ranks in process_ranks)


def place(cluster: ClusterSpec, text: str) -> list[Placement]:
    cp = HybridComponentPlacement({"cluster": {"component_placement": {"actor": text}}}, cluster)
    return cp.get_placements("actor")


def assert_valid_layout(cluster: ClusterSpec, placements: list[Placement]) -> None:
    """The invariants every accepted accelerator layout keeps."""
    assert [p.rank for p in placements] == list(range(len(placements)))
    load: Counter[tuple[int, int]] = Counter()
    for p in placements:
        node = cluster.nodes[p.cluster_node_rank]
        assert p.device_ids, "an accelerator process holds at least one device"
        assert all(0 <= d < node.num_devices for d in p.device_ids)  # devices exist
        assert len(set(p.device_ids)) == len(p.device_ids)
        load.update((p.cluster_node_rank, d) for d in p.device_ids)
    for p in placements:
        loads = {load[(p.cluster_node_rank, d)] for d in p.device_ids}
        assert len(loads) == 1  # a process's devices carry equal loads
        if loads.pop() > 1:
            assert len(p.device_ids) == 1  # sharing a device: each sharer holds only it
    per_node = Counter(p.cluster_node_rank for p in placements)
    assert all(p.local_world_size == per_node[p.cluster_node_rank] for p in placements)


@st.composite
def cluster_and_parts(draw):
    """A cluster and a string of 1-3 parts, each sharing or splitting evenly; parts may
    overlap, come in any order and carry whitespace and a trailing comma."""
    cluster: ClusterSpec = draw(clusters)
    total = cluster.num_devices
    parts, specs, next_rank = [], [], 0
    for _ in range(draw(st.integers(1, 3))):
        a = draw(st.integers(0, total - 1))
        b = draw(st.integers(a, min(total - 1, a + 7)))
        n = b - a + 1
        how = draw(st.sampled_from(["implicit", "share", "split"]))
        if how == "implicit":
            procs = n
            parts.append(f"{a}-{b}")
        else:
            if how == "share":
                procs = n * draw(st.integers(1, 3))
            else:
                procs = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
            parts.append(f"{a}-{b}:{next_rank}-{next_rank + procs - 1}")
        specs.append((a, b, procs))
        next_rank += procs
    pad = draw(st.sampled_from(["", " ", "  "]))
    text = f"{pad},{pad}".join(parts) + draw(st.sampled_from(["", ",", " , "]))
    return cluster, text, specs


@settings(max_examples=150, deadline=None)
@given(cluster_and_parts())
def test_well_formed_strings_are_placed_exactly_or_refused_for_overlap(case):
    cluster, text, specs = case
    named = [set(range(a, b + 1)) for a, b, _ in specs]
    overlap = any(named[i] & named[j] for i in range(len(named)) for j in range(i))
    # a part splitting n devices over p processes gives each n / p consecutive devices
    processes = [
        list(range(a + k * ((b - a + 1) // p), a + (k + 1) * ((b - a + 1) // p)))
        for a, b, p in specs
        if p < b - a + 1
        for k in range(p)
    ]
    straddle = straddles(cluster, processes)
    try:
        placements = place(cluster, text)
    except PlacementError as err:
        msg = str(err)
        # the only ways a well-formed string fails: two parts name one device, or a
        # multi-device process would straddle two nodes, each where it does
        assert overlap or straddle, f"a valid string was refused: {msg}"
        assert ("both name resource" in msg and overlap) or ("straddle" in msg and straddle), msg
        assert repr(text) in msg  # quoted exactly as given
        return
    assert not overlap and not straddle, f"{text!r} was accepted"
    assert not overlap
    assert_valid_layout(cluster, placements)
    start = 0
    for a, b, procs in specs:
        part = placements[start : start + procs]
        start += procs
        used: Counter[int] = Counter()
        for p in part:
            for d in p.device_ids:
                used[global_rank(cluster, p.cluster_node_rank, d)] += 1
        assert set(used) == set(range(a, b + 1))  # exactly the part's resources
        assert len(set(used.values())) == 1  # shared evenly
        assert len({len(p.device_ids) for p in part}) == 1  # split evenly


# Characters a placement string is made of, and the ones that used to be misread.
ALPHABET = "0123456789-:, all\t_\u0663\uff15+"
JUNK = " \t_\u0663\uff15+"


@st.composite
def noisy_strings(draw):
    """Mostly well-formed strings with whitespace in the allowed places, sometimes one junk
    character inserted anywhere (inside a number, too)."""
    ws = st.sampled_from(["", "", " ", "\t"])
    n = st.integers(0, 9)
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        a = draw(n)
        spec = f"{a}{draw(ws)}-{draw(ws)}{a + draw(st.integers(0, 3))}"
        if draw(st.booleans()):
            spec = draw(st.sampled_from([str(a), "all", "ALL"]))
        if draw(st.booleans()):
            p = draw(st.integers(0, 3))
            spec += f"{draw(ws)}:{draw(ws)}{p}-{p + draw(st.integers(0, 7))}"
        parts.append(f"{draw(ws)}{spec}{draw(ws)}")
    text = ",".join(parts) + draw(st.sampled_from(["", ",", " ,"]))
    if draw(st.integers(0, 3)) == 0:
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.sampled_from(JUNK)) + text[i:]
    return text


@settings(max_examples=200, deadline=None)
@given(clusters, st.one_of(st.text(alphabet=ALPHABET, max_size=14), noisy_strings()))
def test_random_strings_are_refused_or_mean_exactly_what_they_say(cluster, text):
    try:
        placements = place(cluster, text)
    except PlacementError as err:
        assert repr(text) in str(err)
        return
    # Never a different device: nothing that int() would have read loosely got through.
    assert "_" not in text and "\u0663" not in text and "\uff15" not in text
    assert "+" not in text
    assert not re.search(r"[0-9]\s+[0-9]", text)
    assert_valid_layout(cluster, placements)
    # The same string without its whitespace and empty parts means the same layout.
    canonical = ",".join(p.replace(" ", "").replace("\t", "") for p in text.split(",") if p.strip())
    assert [(q.cluster_node_rank, q.device_ids) for q in place(cluster, canonical)] == [
        (q.cluster_node_rank, q.device_ids) for q in placements
    ]


@settings(max_examples=100, deadline=None)
@given(mixed_clusters, st.data())
def test_node_processes_see_their_node_and_reserve_nothing(cluster, data):
    ranks = data.draw(st.lists(st.integers(0, cluster.num_nodes - 1), min_size=1, max_size=6))
    isolate = data.draw(st.booleans())
    n = len(ranks)
    text = f"0-{cluster.num_nodes - 1}:0-{n - 1}" if n % cluster.num_nodes == 0 else None
    placements = NodePlacementStrategy(ranks).get_placement(cluster, isolate)
    assert sorted(p.cluster_node_rank for p in placements) == sorted(ranks)
    groups = [placements]
    if text is not None:
        cfg = {
            "cluster": {"component_placement": {"env": {"node_group": "node", "placement": text}}}
        }
        groups.append(HybridComponentPlacement(cfg, cluster).get_placements("env"))
    for group in groups:
        assert [p.rank for p in group] == list(range(len(group)))
        for p in group:
            node = cluster.nodes[p.cluster_node_rank]
            assert p.device_ids == ()  # reserves none
            assert p.visible_accelerators == tuple(str(d) for d in range(node.num_devices))
            assert p.local_accelerator_rank == (0 if node.num_devices else -1)


@settings(max_examples=150, deadline=None)
@given(
    clusters,
    st.integers(0, 31),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 4),
)
def test_packed_never_invents_devices(cluster, start, per, stride, blocks):
    end = start + per * stride * blocks - 1
    strategy = PackedPlacementStrategy(start, end, per, stride)
    # by hand: block b, process j takes b * per * stride + start + j + k * stride, k < per
    size = per * stride
    processes = [
        [start + b * size + j + k * stride for k in range(per)]
        for b in range(blocks)
        for j in range(stride)
    ]
    exists = end < cluster.num_devices
    straddle = exists and straddles(cluster, processes)
    try:
        placements = strategy.get_placement(cluster)
    except PlacementError as err:
        assert not exists or ("straddle" in str(err) and straddle), str(err)
        return
    assert exists and not straddle
    ranks = [global_rank(cluster, p.cluster_node_rank, d) for p in placements for d in p.device_ids]
    assert sorted(ranks) == list(range(start, end + 1))  # each device once, none outside
    assert all(len(p.device_ids) == per for p in placements)
    assert_valid_layout(cluster, placements)
