"""Properties over random clusters and placement strings (hypothesis)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from placement_helpers import make_cluster

from rltrain.errors import PlacementError
from rltrain.placement import HybridComponentPlacement, PackedPlacementStrategy
from rltrain.placement.types import ClusterSpec

clusters = st.lists(st.integers(1, 8), min_size=1, max_size=4).map(make_cluster)


@st.composite
def cluster_and_parts(draw):
    """A cluster and a placement string of 1-3 parts, each sharing or splitting evenly."""
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
        elif how == "share":
            procs = n * draw(st.integers(1, 3))
            parts.append(f"{a}-{b}:{next_rank}-{next_rank + procs - 1}")
        else:
            procs = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
            parts.append(f"{a}-{b}:{next_rank}-{next_rank + procs - 1}")
        specs.append((a, b, procs))
        next_rank += procs
    return cluster, ",".join(parts), specs


def global_rank(cluster: ClusterSpec, node: int, device: int) -> int:
    return sum(n.num_devices for n in cluster.nodes[:node]) + device


@settings(max_examples=150, deadline=None)
@given(cluster_and_parts())
def test_resolved_placements_are_valid_or_refused(case):
    cluster, text, specs = case
    try:
        cp = HybridComponentPlacement(
            {"cluster": {"component_placement": {"actor": text}}}, cluster
        )
    except PlacementError as err:
        assert "straddle" in str(err)  # the only way a well-formed string can fail here
        return
    placements = cp.get_placements("actor")
    assert [p.rank for p in placements] == list(range(sum(s[2] for s in specs)))
    start = 0
    for a, b, procs in specs:
        part = placements[start : start + procs]
        start += procs
        used = Counter()
        for p in part:
            node = cluster.nodes[p.cluster_node_rank]
            assert p.device_ids and all(0 <= d < node.num_devices for d in p.device_ids)
            for d in p.device_ids:
                used[global_rank(cluster, p.cluster_node_rank, d)] += 1
        assert set(used) == set(range(a, b + 1))  # exactly the part's resources
        assert len(set(used.values())) == 1  # shared evenly
        assert len({len(p.device_ids) for p in part}) == 1  # split evenly
    per_node = Counter(p.cluster_node_rank for p in placements)
    assert all(p.local_world_size == per_node[p.cluster_node_rank] for p in placements)


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
    try:
        placements = strategy.get_placement(cluster)
    except PlacementError as err:
        assert end >= cluster.num_devices or "straddle" in str(err)
        return
    assert end < cluster.num_devices
    ranks = [global_rank(cluster, p.cluster_node_rank, d) for p in placements for d in p.device_ids]
    assert sorted(ranks) == list(range(start, end + 1))  # each device once, none outside
    assert all(len(p.device_ids) == per for p in placements)
    assert [p.rank for p in placements] == list(range(len(placements)))
