"""Plan-time engine rules, against hand-computed layouts."""

from __future__ import annotations

import pytest

from rltrain.errors import ConfigError, PlacementError
from rltrain.placement.constraints import (
    GIB,
    check_hybrid_engine_shape,
    check_rollout_memory,
    choose_sync_path,
    collocated_rank_map,
)


def test_hybrid_engine_shape() -> None:
    assert check_hybrid_engine_shape(actor_gpus=16, rollout_gpus=16, rollout_tp=4) == 4
    with pytest.raises(ConfigError, match="does not divide the 6 GPUs"):
        check_hybrid_engine_shape(6, 6, 4)
    with pytest.raises(ConfigError, match="actor has 8, rollout has 4 engines x TP 4 = 16"):
        check_hybrid_engine_shape(8, 16, 4)


def test_rollout_memory() -> None:
    # 80 GiB x 0.5 = 40 GiB reserved, 1 GiB of weights: 39 GiB left for the KV cache.
    assert check_rollout_memory(0.5, 80 * GIB, 1 * GIB) == 39 * GIB
    with pytest.raises(ConfigError, match="not more than the rollout's weights"):
        check_rollout_memory(0.1, 80 * GIB, 10 * GIB)
    with pytest.raises(ConfigError, match=r"keep 41.0 GiB there, over the capacity of 80.0 GiB"):
        check_rollout_memory(0.5, 80 * GIB, 1 * GIB, coresident_bytes=41 * GIB)


def test_collocated_rank_map_takes_the_actor_on_the_same_gpu() -> None:
    actor = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    # Two TP-2 engines whose shards sit on node 1 then node 0.
    rollout = {0: (1, 0), 1: (1, 1), 2: (0, 0), 3: (0, 1)}
    assert collocated_rank_map(actor, rollout) == {0: 2, 1: 3, 2: 0, 3: 1}
    with pytest.raises(PlacementError, match="rollout rank 0 is on node 2 device 0"):
        collocated_rank_map(actor, {0: (2, 0)})
    with pytest.raises(PlacementError, match="share GPU"):
        collocated_rank_map({0: (0, 0), 1: (0, 0)}, {0: (0, 0)})


def test_choose_sync_path() -> None:
    actor = {0: (0, 0), 1: (0, 1)}
    assert choose_sync_path("sim", actor, {0: (0, 0)}) == "host"
    assert choose_sync_path("cuda", actor, {0: (0, 1)}) == "ipc"
    assert choose_sync_path("cuda", actor, {0: (0, 2), 1: (0, 3)}) == "nccl"
    with pytest.raises(PlacementError, match="overlap only partly"):
        choose_sync_path("cuda", actor, {0: (0, 1), 1: (0, 2)})
