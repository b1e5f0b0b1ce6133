"""Process groups set up by the runtime: a group's own, and one spanning two groups."""

from __future__ import annotations

import threading

import pytest
import ray

from rltrain.errors import WorkerError
from rltrain.placement.strategies import NodePlacementStrategy, PackedPlacementStrategy
from rltrain.scheduler import Worker, create_collective

pytestmark = pytest.mark.timeout(240)


class Dist(Worker):
    """Needs torch (imported inside methods so the module stays import-light)."""

    def all_reduce_rank(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return t.item()

    def backend(self) -> str:
        import torch.distributed as dist

        return dist.get_backend()

    def sync_weights(self, value: float) -> list[float]:
        import torch

        pg = self.collective("weight_sync")
        # Collective rank 0 (actor rank 0) sends; everyone ends with its tensor.
        t = torch.full((3,), value if pg.rank() == 0 else -1.0)
        pg.broadcast(t, 0).wait()
        return t.tolist()

    def fail_or_reduce(self, bad_rank: int) -> float:
        if self.rank == bad_rank:
            raise RuntimeError("lost a shard")
        return self.all_reduce_rank()

    def wait_forever(self) -> None:
        threading.Event().wait(600)


def states(group) -> list[str]:
    table = ray._private.state.actors()
    return [table[a._actor_id.hex()]["State"] for a in group.actors]


def test_group_and_cross_group_collectives(cluster):
    actor_ps = PackedPlacementStrategy(0, 1).get_placement(cluster.spec)
    rollout_ps = NodePlacementStrategy([0]).get_placement(cluster.spec)
    res = cluster.reserve({"actor": actor_ps, "rollout": rollout_ps})
    actor = Dist.create_group().launch(
        cluster, name="actor", placement_strategy=actor_ps, reservation=res
    )
    rollout = Dist.create_group().launch(
        cluster, name="rollout", placement_strategy=rollout_ps, reservation=res
    )
    actor.init_process_group()  # simulated devices -> gloo, port picked by rank 0
    assert actor.call(Dist.backend).wait(timeout=60) == ["gloo", "gloo"]
    assert actor.call(Dist.all_reduce_rank).wait(timeout=60) == [3.0, 3.0]

    ranks = create_collective("weight_sync", [actor, rollout])
    assert ranks == {"actor": [0, 1], "rollout": [2]}
    sent = [actor.call(Dist.sync_weights, 7.0), rollout.call(Dist.sync_weights, 0.0)]
    assert [f.wait(timeout=60) for f in sent] == [[[7.0] * 3, [7.0] * 3], [[7.0] * 3]]

    # Rank 0 dies before the all-reduce rank 1 waits in: the failure surfaces at once, rank 1
    # is torn down instead of waiting out the 60 s collective timeout, and so is the rollout
    # group, which shares the weight_sync collective with the actor group.
    pending_rollout = rollout.call(Dist.wait_forever)
    with pytest.raises(WorkerError, match="group 'actor' rank 0"):
        actor.call(Dist.fail_or_reduce, 0).wait(timeout=30)
    assert states(actor) == ["DEAD", "DEAD"] and states(rollout) == ["DEAD"]
    with pytest.raises(WorkerError, match="group 'rollout' rank 0"):
        pending_rollout.wait(timeout=30)
