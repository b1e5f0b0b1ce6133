"""The memory ledger of real workers, checked against the independent measure and the plan."""

from __future__ import annotations

import pytest
import torch

from rltrain.config.schema import RunConfig
from rltrain.errors import WorkerError
from rltrain.placement import memory
from rltrain.placement.sizes import derive_sizes
from rltrain.workers.actor import ActorWorker
from rltrain.workers.rollout import RolloutWorker


def test_undeclared_device_tensor_is_caught_loudly():
    worker = RolloutWorker(RunConfig())  # a plain class: no Ray needed
    worker.memory_report()  # declared state only: fine
    worker.scratch = torch.zeros(1_000_000)  # 4 MB the ledger knows nothing about
    with pytest.raises(WorkerError, match="does not declare"):
        worker.memory_report()
    worker.mover.offload(["weights"])
    del worker.scratch
    report = worker.memory_report()
    assert report["declared"] == 0 and report["offloaded"] == ["weights"]


def test_offload_and_reload_restore_values_bit_for_bit():
    worker = RolloutWorker(RunConfig())
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    moved = worker.offload(["weights", "kv_cache"])
    assert moved > 0 and worker.mover.resident_bytes()["weights"] == 0
    worker.reload(["weights"])
    for n, p in worker.model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_plan_prediction_agrees_with_the_measured_state():
    run = RunConfig()
    actor = ActorWorker(run, derive_sizes(run, 1, 1))
    params = sum(p.numel() for p in actor.model.parameters())
    dims = memory.model_dims(run.model)
    assert memory.param_count(dims) == pytest.approx(params, rel=0.02)
    # one optimizer step creates Adam's state; then compare kind by kind
    loss = sum(p.sum() for p in actor.model.parameters())
    loss.backward()
    actor.optimizer.step()
    measured = actor.state_bytes()
    predicted = {
        "weights": memory.weight_bytes(params, run.model.dtype),
        "grads": memory.grad_bytes(params, run.model.dtype),
        "optimizer": memory.optimizer_bytes(params, run.model.dtype),
    }
    for kind, want in predicted.items():
        assert measured[kind] == pytest.approx(want, rel=0.05), kind
