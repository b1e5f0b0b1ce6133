"""A resumed warmup continues from the count the schedule itself advanced: under fp16 a step
skipped for an overflow advances the warmup but no parameter's Adam step counter."""

from __future__ import annotations

import pytest
import torch
from toy_batches import toy_batch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, add_advantages
from rltrain.backends.training import build_dtype, build_engine
from rltrain.backends.warmup import WARMUP_FILE
from rltrain.config.schema import RunConfig
from rltrain.tasks.model import build_model


def _run(warmup_steps: int) -> RunConfig:
    run = RunConfig()
    run.model.hidden_size, run.model.intermediate_size = 32, 64
    run.model.dtype = "float16"
    run.trainer.train_batch_size, run.rollout.n_samples_per_prompt = 2, 4
    run.optimizer.lr, run.optimizer.warmup_steps = 1e-2, warmup_steps
    run.algorithm.ppo_epochs, run.algorithm.num_minibatches = 1, 1  # one optimizer step
    return run


def _engine(run: RunConfig):
    torch.set_num_threads(1)
    model = build_model(run.model, dtype=build_dtype(run))
    return build_engine(run, model, torch.device("cpu"), micro_batch=8, minibatch=8)


def _batch(run: RunConfig) -> RolloutBatch:
    return add_advantages(toy_batch(), UpdateSettings.from_config(run))


def test_a_warmup_resumed_after_a_skipped_fp16_step_keeps_the_uninterrupted_lr(tmp_path):
    run = _run(warmup_steps=10)
    first = _engine(run)
    first.optimizer.loss_scale.scale = 1e30  # overflows: the step is skipped
    first.update(_batch(run), torch.Generator().manual_seed(0))
    assert first.optimizer.loss_scale.skipped == 1
    first.save_optimizer(str(tmp_path), 0)
    resumed = _engine(run)
    resumed.load_optimizer(str(tmp_path), 0, 1)
    # one warmup step taken (the skipped one): lr = 1e-2 * (1 + 1) / 10 for the next step;
    # Adam's step counters say 0 steps, which would give 1e-2 * 1 / 10
    for engine in (first, resumed):
        assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(2e-3)
    for engine in (first, resumed):
        engine.optimizer.loss_scale.scale = 1024.0
        assert engine.update(_batch(run), torch.Generator().manual_seed(1))[
            "actor/lr"
        ] == pytest.approx(2e-3)
    for a, b in zip(first.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_written_without_warmup_resumes_it_from_the_optimizer_steps(tmp_path):
    run = _run(warmup_steps=0)
    plain = _engine(run)
    plain.update(_batch(run), torch.Generator().manual_seed(0))
    assert plain.optimizer.loss_scale.skipped == 0  # a step taken: Adam counts 1
    plain.save_optimizer(str(tmp_path), 0)
    assert not (tmp_path / WARMUP_FILE).exists()
    warm = _engine(_run(warmup_steps=4))  # the warmup turned on at the resume
    warm.load_optimizer(str(tmp_path), 0, 1)
    assert warm.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 2 / 4)
