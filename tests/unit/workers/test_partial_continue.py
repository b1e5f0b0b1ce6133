"""``trainer.partial_rollout=continue`` on a real rollout worker and the tiny model: a generation
paused mid-decoding keeps its tokens and behaviour log-probs, continues under new weights, and
every token's recorded log-prob is the one of the weights that sampled it (the importance
weights' denominator)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rltrain.algorithms.logprobs import compute_logprobs
from rltrain.config.schema import RunConfig
from rltrain.workers import rollout as rollout_module
from rltrain.workers.rollout import RolloutWorker

PROMPTS = ["1+2=", "3+4="]


def _worker(partial: str = "continue") -> RolloutWorker:
    torch.set_num_threads(1)
    run = RunConfig()
    run = dataclasses.replace(
        run,
        rollout=dataclasses.replace(run.rollout, max_new_tokens=6, n_samples_per_prompt=2),
        trainer=dataclasses.replace(run.trainer, max_staleness=1, partial_rollout=partial),
    )
    worker = RolloutWorker(run)
    worker.version = 0
    return worker


def _pause_after(monkeypatch, steps: int) -> None:
    """The Ray cancellation flag, raised before decoding step ``steps`` of the next call."""
    calls = iter(range(10**6))
    monkeypatch.setattr(rollout_module, "_cancelled", lambda: next(calls) >= steps)


def _new_weights(worker: RolloutWorker, version: int) -> None:
    """An update: move every weight (what a load of the actor's next version does)."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(version)
        for p in worker.model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    worker.version = version


def _logprobs(worker: RolloutWorker, batch) -> torch.Tensor:
    return compute_logprobs(
        worker.model,
        batch.input_ids,
        batch.attention_mask,
        batch.response_mask,
        temperature=worker.run.rollout.temperature,
    )


def test_a_paused_generation_continues_under_new_weights(monkeypatch):
    worker = _worker()
    _pause_after(monkeypatch, 2)
    assert worker.generate(PROMPTS, step=1) is None  # paused: nothing to read
    parked = worker._parked[1]
    assert parked.columns == 2 and parked.started == 0
    old = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    _new_weights(worker, 1)
    monkeypatch.setattr(rollout_module, "_cancelled", lambda: False)
    out = worker.generate(PROMPTS, step=1, resume=True)
    assert out is not None and out.size == 4 and 1 not in worker._parked
    # the tokens sampled before the pause are kept, version 0; the rest are version 1
    assert torch.equal(out.response_ids[:, :2], parked.batch.response_ids)
    live = out.response_mask.bool()
    assert (out.token_versions[:, :2][live[:, :2]] == 0).all()
    assert (out.token_versions[:, 2:][live[:, 2:]] == 1).all() and live[:, 2:].any()
    assert (out.token_versions[~live] == -1).all()
    # each token's behaviour log-prob is that of the weights that sampled it
    new_lp = _logprobs(worker, out)
    v1 = live & (out.token_versions == 1)
    assert torch.allclose(out.rollout_logprobs[v1], new_lp[v1], atol=1e-4)
    with torch.no_grad():
        for n, p in worker.model.named_parameters():
            p.copy_(old[n])
    old_lp = _logprobs(worker, out)
    v0 = live & (out.token_versions == 0)
    assert torch.allclose(out.rollout_logprobs[v0], old_lp[v0], atol=1e-4)
    assert not torch.allclose(old_lp[v1], new_lp[v1], atol=1e-3)  # the weights really moved


def test_a_pause_after_the_last_token_resumes_to_the_finished_batch(monkeypatch):
    worker = _worker()
    monkeypatch.setattr(rollout_module, "_cancelled", lambda: False)
    done = worker.generate(PROMPTS, step=2)
    _new_weights(worker, 1)
    again = worker.generate(PROMPTS, step=2, resume=True)  # the cancel came too late
    assert torch.equal(again.response_ids, done.response_ids)
    assert (again.token_versions[again.response_mask.bool()] == 0).all()


@pytest.mark.parametrize("partial", ["restart", "finish"])
def test_other_policies_keep_nothing_of_a_cancelled_call(monkeypatch, partial):
    worker = _worker(partial)
    _pause_after(monkeypatch, 2)
    assert worker.generate(PROMPTS, step=1) is None
    assert not worker._parked and not worker._ended
