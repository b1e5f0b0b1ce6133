"""``trainer.partial_rollout=carry`` on the torch engine (no modelled lengths): a real
RolloutWorker and tiny model decode carried rows in segments; every token carries the weight
version that sampled it, and the bound drops started groups with their tokens counted."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rltrain.algorithms.logprobs import position_ids_from_mask
from rltrain.config.schema import RunConfig
from rltrain.workers.rollout import RolloutWorker

PROMPTS = [["1+1=", "2+2="], ["3+3=", "4+4="], ["5+5=", "6+6="], ["7+7=", "8+8="]]


@pytest.fixture(scope="module")
def worker() -> RolloutWorker:
    torch.set_num_threads(1)
    run = RunConfig()
    run = dataclasses.replace(
        run,
        rollout=dataclasses.replace(run.rollout, max_new_tokens=6, n_samples_per_prompt=2),
        trainer=dataclasses.replace(
            run.trainer, max_staleness=2, partial_rollout="carry", carry_segment=2
        ),
    )
    return RolloutWorker(run)


def _weights(base: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    """Version ``version``'s weights: the base ones moved by a seeded step (each version
    samples from another distribution, so a token's log-prob tells which one sampled it)."""
    g = torch.Generator().manual_seed(version)
    return {k: v + 0.05 * version * torch.randn(v.shape, generator=g) for k, v in base.items()}


def _logprobs_under(model, batch) -> torch.Tensor:
    """``[B, R]`` log-probs of the batch's response tokens under ``model`` (full recompute)."""
    ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    mask = batch.attention_mask
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
    ).logits
    p = batch.prompt_ids.shape[1]
    logps = torch.log_softmax(logits[:, p - 1 : -1].float(), dim=-1)
    return logps.gather(-1, batch.response_ids[:, :, None]).squeeze(-1)


def test_carried_rows_continue_under_new_weights_and_each_token_keeps_its_version(worker):
    w = worker
    base = {k: v.clone() for k, v in w.model.state_dict().items()}
    w.version = 0
    w.model.load_state_dict(_weights(base, 0))
    assert w.generate(PROMPTS[0], 9, oldest_version=0, hand_on=False) is None  # queued only
    assert w.carry_stats()["busy"] == 0  # nothing decoded yet
    batches, sent = {}, [p for call in PROMPTS for p in call]
    for v in (1, 2, 3):
        w.version = v
        w.model.load_state_dict(_weights(base, v))
        batches[v] = w.generate(PROMPTS[v], 9 + v, oldest_version=v - 2)
    handed = [
        p.strip()
        for v in (1, 2, 3)
        for p in w.tokenizer.batch_decode(batches[v].prompt_ids.tolist(), skip_special_tokens=True)
    ]
    # groups go out whole (n rows each) in admission order
    assert handed == [p for p in sent[:6] for _ in range(2)]
    mixed = 0
    with torch.no_grad():
        for v, batch in batches.items():
            assert batch.group_size == 2 and batch.discarded_tokens == 0
            live = batch.response_mask.bool()
            versions = batch.token_versions
            assert bool(((versions <= v) & (versions >= 1))[live].all())
            for row, m in zip(versions, live, strict=True):  # a row's versions never go back
                assert bool((row[m][1:] >= row[m][:-1]).all())
            mixed += sum(
                len(set(row[m].tolist())) > 1 for row, m in zip(versions, live, strict=True)
            )
            for u in versions[live].unique().tolist():
                w.model.load_state_dict(_weights(base, u))
                mine = live & (versions == u)
                got = _logprobs_under(w.model, batch)[mine]
                torch.testing.assert_close(batch.rollout_logprobs[mine], got, atol=2e-4, rtol=1e-3)
                other = _weights(base, u + 1 if u < 3 else u - 1)
                w.model.load_state_dict(other)  # the other weights would not have given them
                assert not torch.allclose(_logprobs_under(w.model, batch)[mine], got, atol=1e-3)
    assert mixed >= 1  # a row carried across a weight swap holds both versions' tokens
    w.model.load_state_dict(base)


def test_the_bound_drops_started_groups_and_counts_their_tokens(worker):
    w = worker
    w.version = 0
    w.generate(PROMPTS[0], 20, oldest_version=0, hand_on=False)
    w.version = 1
    w.generate(PROMPTS[1], 21, oldest_version=0)
    state = w._carry
    started = {k: state.tokens(k) for k in state.prompts if state.tokens(k)}
    again = sorted(state.prompts[k] for k in started)
    assert started  # segments of 2 of 6-token budgets: a row is mid-response
    w.version = 3  # two versions later: started groups (version 1) are past oldest=2
    out = w.generate(PROMPTS[2], 23, oldest_version=2)
    assert out.discarded_tokens == sum(started.values())
    assert w.carry_stats()["dropped"] == len(started)
    live = out.response_mask.bool()
    assert int(out.token_versions[live].min()) >= 2  # nothing past the bound trains
    # the dropped groups' prompts are queued again (handed on already, or still held)
    out_prompts = w.tokenizer.batch_decode(out.prompt_ids.tolist(), skip_special_tokens=True)
    requeued = [p for k, p in state.prompts.items() if k > max(started)]
    assert all(p in requeued or p in [q.strip() for q in out_prompts] for p in again)
