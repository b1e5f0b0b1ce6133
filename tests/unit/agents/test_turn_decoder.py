"""The continuous-batching decoder of turns, by hand: rows join and leave the running batch, and
what a turn samples does not depend on the rows it shared the batch with."""

from __future__ import annotations

import pytest
import torch

from rltrain.agents.decoding import TurnDecoder, TurnRequest
from rltrain.algorithms.sampling import SamplingParams
from rltrain.config.schema import ModelConfig
from rltrain.errors import WorkerError
from rltrain.tasks.model import build_model

A = TurnRequest("a", [5, 6, 7, 8, 9, 10], budget=2, seed=11)  # the longest prefix: 6
B = TurnRequest("b", [7, 8, 9], budget=4, seed=12)
C = TurnRequest("c", [9, 10, 11, 12], budget=3, seed=13)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_chars="abcdefghijklmnop", hidden_size=32)).eval()


def _decoder(model, slots: int) -> TurnDecoder:
    params = SamplingParams(temperature=1.0)
    return TurnDecoder(model, params, (), 0, torch.device("cpu"), slots, with_logprobs=True)


def _alone(model, request: TurnRequest):
    """The turn decoded in a batch of its own."""
    d = _decoder(model, 1)
    out = d.join([request])
    while not out:
        out = d.step()
    return out[0]


def test_rows_join_and_leave_the_running_batch(model):
    d = _decoder(model, 3)
    assert d.join([A, B]) == [] and len(d.rows) == 2 and d.attn.shape == (2, 6)
    (a,) = d.step()  # A's second token ends its budget of 2: it leaves, B holds its slot
    assert a.key == "a" and len(a.ids) == 2 and [r.request.key for r in d.rows] == ["b"]
    # the columns only A attended to are dropped: B sees its 3 prompt ids and 1 token fed
    assert d.attn.shape == (1, 4) and int(d.attn.sum()) == 4
    assert d.join([C]) == [] and d.free == 1 and d.attn.shape == (2, 4)
    assert d.step() == []  # B has 3 tokens of 4, C 2 of 3
    ended = d.step()
    assert sorted(r.key for r in ended) == ["b", "c"] and d.rows == [] and d.free == 3
    results = {r.key: r for r in (a, *ended)}
    for request in (A, B, C):  # what a turn samples is what it samples alone
        alone, got = _alone(model, request), results[request.key]
        assert got.ids == alone.ids and len(got.ids) == request.budget
        assert max(abs(x - y) for x, y in zip(got.logprobs, alone.logprobs, strict=True)) < 1e-5
    assert d.forwards == 5  # 2 joins, 3 steps: a joining turn costs one prefill, not a restart


def test_a_turn_ends_at_a_stop_id_and_a_full_decoder_refuses_more(model):
    first = _alone(model, A).ids[0]
    d = TurnDecoder(model, SamplingParams(), {first}, 0, torch.device("cpu"), 2, False)
    (a,) = d.join([A])  # its first token is a stop id: it ends at once and takes no slot
    assert a.ids == [first] and a.logprobs == [0.0] and d.free == 2
    full = _decoder(model, 2)
    full.join([B, C])
    with pytest.raises(WorkerError, match="1 turns joined a decoder with 0 free slots"):
        full.join([A])


def test_a_turn_resumed_from_its_held_cache_samples_what_a_full_prefill_does(model):
    first = _alone(model, A)
    # the cache covers the prefix and every sampled id but the last (never fed)
    assert first.past[0][0].shape[1] == len(A.prefix) + len(first.ids) - 1
    prefix = [*A.prefix, *first.ids, 3, 4]  # the trajectory, then an observation's ids
    fresh = _alone(model, TurnRequest("a2", prefix, budget=5, seed=21))
    d = _decoder(model, 2)
    d.join([B])  # a row without a held cache shares the batch
    out = d.join([TurnRequest("a2", prefix, budget=5, seed=21, past=first.past)])
    while len(out) < 1 or out[-1].key != "a2":
        out += d.step()
    resumed = next(r for r in out if r.key == "a2")
    assert resumed.ids == fresh.ids
    assert max(abs(x - y) for x, y in zip(resumed.logprobs, fresh.logprobs, strict=True)) < 1e-5


def test_a_turn_draws_its_generators_races_token_by_token(model):
    """The races drawn ahead (4 tokens at a time here, then the next 4) are the ones a
    token-by-token sampler draws from the turn's generator: full forward passes, no cache."""
    request = TurnRequest("a", [5, 6, 7, 8], budget=7, seed=31)
    got = _alone(model, request)
    generator, ids, logprobs = torch.Generator().manual_seed(31), list(request.prefix), []
    with torch.no_grad():
        for _ in range(request.budget):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            race = torch.empty(logits.shape[-1]).exponential_(1, generator=generator)
            token = int((torch.softmax(logits, -1) / race).argmax())
            ids.append(token)
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
    assert got.ids == ids[len(request.prefix) :]
    assert max(abs(x - y) for x, y in zip(got.logprobs, logprobs, strict=True)) < 1e-5
