"""``trainer.partial_rollout=carry`` on a real RolloutWorker and tiny model: a call hands on
complete groups (carried ones first) with the version that sampled each token, carries the
unfinished rows, and drops groups past the bound with their tokens counted as discarded."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from rltrain.config.schema import RunConfig
from rltrain.workers import rollout as rollout_module
from rltrain.workers.rollout import RolloutWorker

# modelled lengths of each admission's rows (2 samples per prompt), in order: the priming
# call, the first call, then the second call's group sampled again and its new prompts
LENGTHS = [[1, 1, 1, 12], [2, 2, 1, 1], [1, 1], [1, 1, 1, 1]]
PROMPTS = [["1+1=", "2+2="], ["3+3=", "4+4="], ["5+5=", "6+6="]]


@pytest.fixture
def worker(monkeypatch) -> tuple[RolloutWorker, list[float]]:
    torch.set_num_threads(1)
    run = RunConfig()
    run = dataclasses.replace(
        run,
        rollout=dataclasses.replace(run.rollout, max_new_tokens=4, n_samples_per_prompt=2),
        trainer=dataclasses.replace(
            run.trainer, max_staleness=2, partial_rollout="carry", carry_segment=4
        ),
        simulate=dataclasses.replace(
            run.simulate, rollout_token_latency_ms=10.0, response_length_median=8.0
        ),
    )
    drawn = iter(LENGTHS)
    monkeypatch.setattr(
        rollout_module,
        "simulated_lengths",
        lambda median: SimpleNamespace(sample=lambda rng, n: next(drawn)),
    )
    waited: list[float] = []
    monkeypatch.setattr(rollout_module, "_sleep_unless_cancelled", waited.append)
    return RolloutWorker(run), waited


def _versions(batch) -> list[int]:
    live = batch.response_mask.bool()
    return [
        int(v[m].min()) if bool(m.any()) else -1
        for v, m in zip(batch.token_versions, live, strict=True)
    ]


def _prompts(w: RolloutWorker, batch) -> list[str]:
    return w.tokenizer.batch_decode(batch.prompt_ids.tolist(), skip_special_tokens=True)


def test_rows_carry_into_the_next_call_and_keep_their_versions(worker):
    w, waited = worker
    w.version = 0
    assert w.generate(PROMPTS[0], 9, oldest_version=0, hand_on=False) is None  # primes
    assert waited == []  # queued, not decoded
    w.version = 1
    first = w.generate(PROMPTS[1], 10, oldest_version=0, due_version=0)  # no deadline yet
    # slots 4, segment 4: [1,1,1,12] decode 4 steps (group 0 ends); then the 12-row (8 left)
    # with [2,2,1]: 4 steps, group 2 ends. Groups 0 (version 0) and 2 (version 1) go.
    assert waited == [pytest.approx(0.08)]
    assert _versions(first) == [0, 0, 1, 1]
    assert [p.strip() for p in _prompts(w, first)] == ["1+1=", "1+1=", "3+3=", "3+3="]
    assert first.discarded_tokens == 0
    assert (
        first.rollout_logprobs is not None
        and first.rollout_logprobs.shape == first.response_mask.shape
    )
    assert w.carry_stats()["carried_rows"] == 2  # the 12-row of group 1, and group 3's 1-row
    w.version = 2
    second = w.generate(PROMPTS[2], 11, oldest_version=1)
    # group 1 started with version 0 < 1: dropped with its sampled tokens, and its prompt
    # sampled again with version 2 (queued before the new prompts); group 3's last row, the
    # two rows sampled again and one new row decode one step: group 3 (version 1) and the one
    # sampled again (version 2) go
    assert waited[1] == pytest.approx(0.01)
    assert _versions(second) == [1, 1, 2, 2]
    assert [p.strip() for p in _prompts(w, second)] == ["4+4=", "4+4=", "2+2=", "2+2="]
    assert second.discarded_tokens >= 2  # two rows of at least one token each
    stats = w.carry_stats()
    assert (stats["handed_on"], stats["dropped"], stats["steps"]) == (4, 1, 9)
    assert stats["busy"] == 7 + 9 + 4 and stats["slot_steps"] == 4 * 9


def test_a_first_call_starts_a_new_buffer(worker):
    w, _ = worker
    w.version = 0
    w.generate(PROMPTS[0], 9, oldest_version=0, hand_on=False)
    w.generate(PROMPTS[1], 3, oldest_version=0, hand_on=False)  # a new schedule primes again
    assert w.carry_stats()["carried_rows"] == 4  # only the second priming's rows


def test_a_call_finishes_the_groups_the_next_call_would_drop(worker):
    w, waited = worker
    w.version = 0
    w.generate(PROMPTS[0], 9, oldest_version=0, hand_on=False)
    w.version = 1
    first = w.generate(PROMPTS[1], 10, oldest_version=0, due_version=1)
    # as above for 8 steps (groups 0 and 2 complete, enough), but group 1 (version 0) is due:
    # its 12-row (4 left) and group 3's last row decode 4 more steps. The two version-0 groups
    # go; nothing will be past the bound at the next call.
    assert waited == [pytest.approx(0.12)]
    assert _versions(first) == [0, 0, 0, 0]
    assert [p.strip() for p in _prompts(w, first)] == ["1+1=", "1+1=", "2+2=", "2+2="]
    assert w.carry_stats()["carried_rows"] == 0


def test_a_deeper_prime_extends_one_buffer_with_the_segment_it_was_sent(worker):
    """``trainer.carry_surplus=2``: two prime calls, the second extending the buffer the
    first started with segment 1 (a new buffer would hold its 4 rows only). Slots 4: group
    0's two 1-rows and group 1's rows decode; after 1 step group 0 is complete and goes
    (segments of 4 would take 4 steps: group 1's 12-row is longer)."""
    w, waited = worker
    w.version = 0
    assert w.generate(PROMPTS[0], 8, hand_on=False, segment=1) is None
    assert w.generate(PROMPTS[1], 9, hand_on=False, extend=True) is None
    assert w.carry_stats()["carried_rows"] == 8 and waited == []
    done = w.generate(PROMPTS[2][:1], 10, oldest_version=0, due_version=0)
    assert waited == [pytest.approx(0.01)]
    assert [p.strip() for p in _prompts(w, done)] == ["1+1=", "1+1="]
