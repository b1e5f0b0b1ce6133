"""The actor's allocator peaks (``actor/memory_*_peak_gib``): read from CUDA's allocator for
the update's window only, nothing off CUDA, the largest over the ranks."""

from __future__ import annotations

import torch

from rltrain.runners.stages import _mean_metrics
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
