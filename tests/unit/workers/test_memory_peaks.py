"""The actor's allocator peaks (``actor/memory_*_peak_gib``): read from CUDA's allocator for
the update's window only, nothing off CUDA, the largest over the ranks; and its cached blocks
handed back after an update when a receiver process shares its device."""

from __future__ import annotations

import pytest
import torch

from rltrain.backends.offload import release_cached_blocks
from rltrain.config.schema import RunConfig
from rltrain.placement.sizes import derive_sizes
from rltrain.placement.transport_choice import TransportChoice
from rltrain.runners.stages import _mean_metrics
from rltrain.workers.actor import ActorWorker
from rltrain.workers.common import TrainResult, memory_peaks


def test_peaks_are_cudas_allocator_figures_for_the_window_since_the_reset(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset", d)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: 5 * 2**29)
    cuda = torch.device("cuda", 0)
    assert memory_peaks(cuda, reset=True) == {} and calls == [("reset", cuda)]
    assert memory_peaks(cuda) == {
        "actor/memory_allocated_peak_gib": 3.0,
        "actor/memory_reserved_peak_gib": 2.5,
    }
    assert set(memory_peaks(cuda, component="critic")) == {
        "critic/memory_allocated_peak_gib",
        "critic/memory_reserved_peak_gib",
    }


def test_no_peaks_off_cuda():
    assert memory_peaks(torch.device("cpu")) == {}
    assert memory_peaks(torch.device("cpu"), reset=True) == {}


def test_ranks_report_their_largest_peak_and_the_mean_of_the_rest():
    ranks = [
        TrainResult({"actor/memory_reserved_peak_gib": 40.0, "actor/pg_loss": 1.0}, {}),
        TrainResult({"actor/memory_reserved_peak_gib": 44.5, "actor/pg_loss": 3.0}, {}),
    ]
    out = _mean_metrics(ranks)
    assert out == {"actor/memory_reserved_peak_gib": 44.5, "actor/pg_loss": 2.0}


def test_released_blocks_go_back_to_the_driver_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: calls.append(("sync", d)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty",)))
    assert release_cached_blocks(torch.device("cpu")) is False and calls == []
    cuda = torch.device("cuda", 0)
    assert release_cached_blocks(cuda) is True
    assert calls == [("sync", cuda), ("empty",)]


class _Rows:
    """What ``update`` needs of a batch here: ``to`` and the trained tokens."""

    token_mask = torch.ones(2, 3)

    def to(self, device):
        return self


@pytest.mark.parametrize(
    ("transport", "feeder", "released"),
    [("ipc", 0, 1), ("ipc", 1, 0), ("host", 0, 0), (None, 0, 0)],
)
def test_an_actor_whose_receiver_shares_its_device_releases_after_each_update(
    transport, feeder, released, monkeypatch
):
    """An ipc receiver is another process on the actor's device that allocates next (vLLM
    wakes its weights): the update's cached blocks go back first. A host or no receiver (a
    device of its own, or a fused rank), or an ipc receiver fed by another actor rank, keeps
    the cache for the next update."""
    import rltrain.workers.actor as actor_mod

    run = RunConfig()
    run.model.num_layers = 1
    actor = ActorWorker(run, derive_sizes(run, 1, 1))
    if transport is not None:
        choice = TransportChoice(transport, "test", feeders=((0, (feeder,)),))
        actor.setup_weight_sync({"rollout": choice})
    seen = []
    monkeypatch.setattr(actor_mod, "release_cached_blocks", lambda d: seen.append(d) or True)
    monkeypatch.setattr(actor.engine, "update", lambda batch, gen: {"actor/pg_loss": 0.5})
    result = actor.update(_Rows(), step=3)
    # no allocator peaks off CUDA; the trained tokens weigh the rank over the others
    assert result.metrics == {"actor/pg_loss": 0.5, "actor/loss_tokens": 6.0}
    assert seen == [actor.device] * released
