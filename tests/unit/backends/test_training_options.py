"""optimizer.warmup_steps and actor.gradient_checkpointing in the torch training engine."""

from __future__ import annotations

import pytest
import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, actor_loss, add_advantages
from rltrain.backends.training import TorchEngine, warmup_factor
from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.placement.plan import build_plan
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec
from rltrain.tasks.model import build_model


def _run(**actor) -> RunConfig:
    run = RunConfig()
    run.model = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=3, init_seed=3)
    for k, v in actor.items():
        setattr(run.actor, k, v)
    run.placement.component_placement = {"actor,rollout": "all", "reward": "0"}
    return run


def _batch(run: RunConfig, rows: int = 8) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1, 2, 3, 4] * (rows // 4))
    mask = (torch.arange(4)[None, :] < lengths[:, None]).float()
    batch = RolloutBatch(
        prompt_ids=torch.randint(3, 20, (rows, 5), generator=g),
        prompt_mask=torch.ones(rows, 5, dtype=torch.long),
        response_ids=torch.randint(3, 20, (rows, 4), generator=g) * mask.long(),
        response_mask=mask,
        group_size=4,
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0] * (rows // 4)),
    )
    return add_advantages(batch, UpdateSettings.from_config(run))


def test_warmup_factor_by_hand():
    assert [warmup_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0 and warmup_factor(7, -1) == 1.0


def test_torch_engine_warms_up_linearly_and_resumes_the_warmup(tmp_path):
    run = _run()
    run.optimizer.lr, run.optimizer.warmup_steps = 0.01, 3
    run.algorithm.num_minibatches = 2  # two optimizer steps per update
    engine = TorchEngine(run, build_model(run.model), torch.device("cpu"))
    batch, gen = _batch(run), torch.Generator().manual_seed(0)
    lrs = [engine.update(batch, gen)["actor/lr"] for _ in range(2)]
    # update 0 takes steps 0 and 1 (lr/3, 2lr/3), update 1 steps 2 and 3 (lr, lr)
    assert lrs == pytest.approx([0.01 / 3, 0.01])
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    # A checkpoint taken after one update resumes at step 2.
    first = TorchEngine(run, build_model(run.model), torch.device("cpu"))
    first.update(batch, gen)
    first.save_optimizer(str(tmp_path), 0)
    resumed = TorchEngine(run, build_model(run.model), torch.device("cpu"))
    resumed.load_optimizer(str(tmp_path), 0, 1)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    assert resumed.update(batch, gen)["actor/lr"] == pytest.approx(0.01)
    # Without warmup the rate is optimizer.lr from the first step.
    run.optimizer.warmup_steps = 0
    plain = TorchEngine(run, build_model(run.model), torch.device("cpu"))
    assert plain.update(batch, gen)["actor/lr"] == 0.01


def _saved_bytes_and_grads(engine: TorchEngine, batch: RolloutBatch, s: UpdateSettings):
    """Bytes of the distinct storages autograd keeps for the backward, and the gradients."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    engine.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = actor_loss(engine.model, batch, s)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in engine.model.named_parameters()}
    return sum(saved.values()), grads


def test_gradient_checkpointing_keeps_gradients_and_saves_activation_memory():
    runs = {flag: _run(gradient_checkpointing=flag) for flag in (False, True)}
    measured, grads, predicted = {}, {}, {}
    for flag, run in runs.items():
        engine = TorchEngine(run, build_model(run.model), torch.device("cpu"), checkpointing=flag)
        batch = _batch(run, rows=16)
        measured[flag], grads[flag] = _saved_bytes_and_grads(
            engine, batch, UpdateSettings.from_config(run)
        )
        cluster = ClusterSpec((NodeSpec(0, 2, 80 * GIB, "sim"),))
        terms = build_plan(run, cluster).memory[(0, 0)].stage("train").terms
        predicted[flag] = sum(
            t.bytes for t in terms if (t.component, t.kind) == ("actor", "activations")
        )
    for name, g in grads[False].items():
        torch.testing.assert_close(grads[True][name], g, rtol=1e-5, atol=1e-7)
    # The plan predicts less activation memory with checkpointing, and so it is measured.
    assert predicted[True] < predicted[False]
    assert measured[True] < 0.5 * measured[False]
