"""``simulate.*``'s device time of a generate call: per call, plus per decoding step; with
``simulate.response_length_median``, per step of the longest modelled (heavy-tailed) row."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from rltrain.algorithms.sampling import GenerationStopped
from rltrain.config.schema import RunConfig, SimulateConfig
from rltrain.config.seeds import sampling_seed
from rltrain.whatif import lengths
from rltrain.workers import rollout as rollout_module
from rltrain.workers.rollout import RolloutWorker, modelled_generate_s, modelled_steps

# three responses of 2, 5 and 3 tokens: the batch decodes 5 steps
MASK = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.float32)


def _run(**sim: float) -> RunConfig:
    run = RunConfig()
    return dataclasses.replace(run, simulate=dataclasses.replace(SimulateConfig(), **sim))


def test_a_call_waits_its_latency_plus_the_longest_responses_tokens():
    batch = SimpleNamespace(response_mask=MASK)
    timed = _run(rollout_latency_ms=100.0, rollout_token_latency_ms=10.0)
    assert modelled_generate_s(timed, batch, 0, 0) == pytest.approx(0.15)
    assert modelled_generate_s(_run(), batch, 0, 0) == 0.0
    assert modelled_generate_s(_run(rollout_latency_ms=100.0), None, 0, 0) == pytest.approx(0.1)


def test_modelled_lengths_are_heavy_tailed_and_drawn_per_step_and_rank():
    run = _run(rollout_token_latency_ms=10.0, response_length_median=8.0)
    batch = SimpleNamespace(response_mask=MASK)
    rng = random.Random(sampling_seed(run.seed, 3, 1))
    drawn = lengths.simulated(8.0).sample(rng, 3)
    assert modelled_steps(run, 3, 1, batch) == max(drawn)  # the simulator's draw, not the 5
    assert modelled_generate_s(run, batch, 3, 1) == pytest.approx(max(drawn) / 100)
    many = lengths.simulated(8.0).sample(random.Random(0), 20_000)
    assert max(many) == 128  # capped at 16x the median
    assert sorted(many)[10_000] == 8  # the median
    assert sum(many) / len(many) > 12  # the tail pulls the mean up (e^0.5 x 8 = 13.2 uncapped)


def _worker(partial: str) -> RolloutWorker:
    torch.set_num_threads(1)
    run = RunConfig()
    run = dataclasses.replace(
        run,
        rollout=dataclasses.replace(run.rollout, max_new_tokens=4, n_samples_per_prompt=2),
        trainer=dataclasses.replace(run.trainer, max_staleness=1, partial_rollout=partial),
        simulate=dataclasses.replace(
            run.simulate, rollout_token_latency_ms=2.0, response_length_median=8.0
        ),
    )
    worker = RolloutWorker(run)
    worker.version = 0
    return worker


@pytest.mark.parametrize("partial", ["continue", "restart"])
def test_a_pause_in_the_modelled_decoding_keeps_its_progress_only_with_continue(
    monkeypatch, partial
):
    worker = _worker(partial)
    asked: list[float] = []

    def sleep_once_then_pause(seconds: float) -> None:
        asked.append(seconds)
        if len(asked) == 1:
            rollout_module.time.sleep(0.02)  # some of the modelled decoding, then the swap
            raise GenerationStopped

    monkeypatch.setattr(rollout_module, "_sleep_unless_cancelled", sleep_once_then_pause)
    assert worker.generate(["1+2="], step=0) is None  # paused inside its modelled decoding
    batch = SimpleNamespace(response_mask=torch.ones(2, 1))
    total = 2.0 * modelled_steps(worker.run, 0, worker.rank, batch) / 1000
    assert asked == [pytest.approx(total)]
    if partial == "continue":
        assert worker._modelled[0] >= 0.02  # the progress is kept for the resumed call
        out = worker.generate(["1+2="], step=0, resume=True)
        assert out is not None and len(out.response_mask) == 2
        assert asked[1] <= total - 0.02  # only the rest is waited
        assert 0 not in worker._modelled
    else:
        assert worker._modelled == {}  # restart: the resubmitted call waits it all again
        out = worker.generate(["1+2="], step=0)
        assert out is not None and asked[1] == pytest.approx(total)
        assert out.discarded_tokens > 0  # the cancelled pass's tokens were thrown away


def test_a_call_paused_in_its_fixed_cost_pays_it_again_when_resumed(monkeypatch):
    # Its rows had all ended (the tiny model decodes in no time); the pause came inside the
    # simulated device's fixed cost. The resumed call is a call again: it pays that cost, as
    # the what-if simulator's continued call does, instead of handing the batch on at once.
    worker = _worker("continue")
    worker.run = dataclasses.replace(
        worker.run, simulate=dataclasses.replace(SimulateConfig(), rollout_latency_ms=300.0)
    )
    asked: list[float] = []

    def sleep_once_then_pause(seconds: float) -> None:
        asked.append(seconds)
        if len(asked) == 1:
            raise GenerationStopped

    monkeypatch.setattr(rollout_module, "_sleep_unless_cancelled", sleep_once_then_pause)
    assert worker.generate(["1+2="], step=0) is None  # paused inside the fixed cost
    out = worker.generate(["1+2="], step=0, resume=True)
    assert out is not None and len(out.response_mask) == 2
    assert asked == [pytest.approx(0.3), pytest.approx(0.3)]
