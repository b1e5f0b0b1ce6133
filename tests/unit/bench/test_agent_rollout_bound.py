"""The agent_rollout bench's bound, by hand: the least time any schedule could take is the
largest of the generation alone, the longest episode's own chain and the tools' throughput."""

from __future__ import annotations

import pytest

from rltrain.bench.measures.agent_rollout import bound_seconds


def test_the_bound_is_the_largest_of_its_three_lower_bounds():
    # episode 0: 2 calls, 30 tokens -> 30 x 0.01 + 2 x 0.5 = 1.3 s; episode 1: 1 x 0.5 + 0.1
    got = bound_seconds(
        1.0, calls=[2, 1], tokens=[30, 10], latency_s=0.5, forward_s=0.01, concurrency=8
    )
    assert got["critical path"] == pytest.approx(1.3)
    assert got["tools"] == pytest.approx(0.5)  # 3 calls through 8 slots: one round
    assert got["bound"] == pytest.approx(1.3)  # the chain, not the generation alone (1.0)
    # generation alone dominates when the latency is small
    assert bound_seconds(1.0, [2, 1], [30, 10], 0.1, 0.01, 8)["bound"] == pytest.approx(1.0)
    # one tool slot: 3 calls one after another (1.5 s) outlast the chain (1.3 s)
    one = bound_seconds(1.0, [2, 1], [30, 10], 0.5, 0.01, 1)
    assert one["tools"] == pytest.approx(1.5) and one["bound"] == pytest.approx(1.5)
