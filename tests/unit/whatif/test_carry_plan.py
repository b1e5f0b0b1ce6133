"""The what-if simulator's ``trainer.partial_rollout=carry`` schedule (:class:`CarryPipeline`):
it runs the rollout's own carry buffer on the lengths the rollout draws, so ``mode=plan``
predicts a carry run instead of refusing it."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from rltrain.backends.generation import sampling_seed as rollout_sampling_seed
from rltrain.config.schema import RunConfig
from rltrain.runners.plan_command import plan_command
from rltrain.whatif.calibrate import Calibration
from rltrain.whatif.events import CarryPipeline, Sink, simulate, unmodelled
from rltrain.whatif.hardware import SIM
from rltrain.whatif.lengths import from_config, simulated
from rltrain.whatif.slots import CarryBuffer
from rltrain.whatif.workload import Proc, StepModel

#: No host terms: a call lasts its modelled device time only.
CAL = Calibration(call_s=0.0, overhead_s=0.0, generate_extra_s=0.0, decode_step_s=0.0)


class Scripted:
    """Lengths handed out in order, call after call (each call's ``n`` rows)."""

    def __init__(self, lengths: list[int]) -> None:
        self.left = list(lengths)

    def sample(self, rng: random.Random, n: int) -> list[int]:
        out, self.left = self.left[:n], self.left[n:]
        return out

    def mean(self) -> float:
        return 4.0


def _model(run, lengths=None):
    procs = {
        "actor": (Proc("actor", 0, ("node0/dev0",), 0),),
        "rollout": (Proc("rollout", 0, ("node0/dev1",), 0),),
    }
    return StepModel(run, procs, SIM, SIM.intra, CAL, lengths=lengths)


def _periods(sink: Sink) -> list[float]:
    s = sink.step_starts
    return [b - a for a, b in zip(s, s[1:], strict=False)]


def _carry_run(**trainer):
    """1 prompt x 2 samples a step on one rollout rank (2 slots); 0.1 s per call plus 0.01 s
    per decoding step; segments of 1 step (re-packed at every step)."""
    run = RunConfig()
    run = dataclasses.replace(
        run,
        simulate=dataclasses.replace(
            run.simulate,
            rollout_latency_ms=100.0,
            actor_latency_ms=50.0,
            rollout_token_latency_ms=10.0,
            response_length_median=4,
        ),
        rollout=dataclasses.replace(run.rollout, n_samples_per_prompt=2),
        trainer=dataclasses.replace(
            run.trainer,
            train_batch_size=1,
            **{"carry_segment": 1, "max_staleness": 2, "partial_rollout": "carry", **trainer},
        ),
    )
    return run


def test_a_carry_call_lasts_the_segments_its_buffer_decodes():
    """Prime: group A = rows (2, 9). Call 0 admits B = (3, 3): slots hold A's rows; at step 2
    row A0 ends and B0 takes its slot; B0 ends at step 5 while A1 and B1 decode; at step 8 B1
    ends, so B (not A) completes first: 8 steps, B handed on. Call 1 admits C = (1, 1): A1 ends
    at step 9 - 8 = 1 more step, completing A: 1 step."""
    m = _model(_carry_run(), lengths=Scripted([2, 9, 3, 3, 1, 1, 5, 5, 5, 5]))
    pipe = CarryPipeline(m, 2, Sink())
    pipe.fill(0, 0.0, 4)  # primes, then submits steps 0 and 1 (one generation ahead)
    calls = [end - start for job in pipe.queue for start, end in job.work]
    assert calls == pytest.approx([0.1 + 8 * 0.01, 0.1 + 1 * 0.01])
    assert [job.version for job in pipe.queue] == [0, 0]
    # C's second row waits in the buffer for the next call
    assert pipe.buffers[0].carried_rows() == 1


def test_a_deeper_surplus_primes_that_many_steps_of_groups_first():
    """``trainer.carry_surplus=2`` (k = 3): the prime samples A = (2, 9) and B = (3, 3), one
    call each, so call 0 holds C = (1, 1) as well. A0 ends at step 2, B0 takes its slot and
    ends at 5, B1 at 8, when B completes (A1 has 1 step left): 8 steps, B handed on. Call 1
    admits D = (1, 1): A1 and C0 end in 1 step, A goes; C1 and D wait for the next call."""
    run = _carry_run(max_staleness=3, carry_surplus=2)
    m = _model(run, lengths=Scripted([2, 9, 3, 3, 1, 1, 1, 1]))
    pipe = CarryPipeline(m, 3, Sink())
    pipe.fill(0, 0.0, 4)
    calls = [end - start for job in pipe.queue for start, end in job.work]
    assert calls == pytest.approx([0.1 + 8 * 0.01, 0.1 + 1 * 0.01])
    assert pipe.buffers[0].held() == [2, 3] and pipe.buffers[0].carried_rows() == 3


def test_a_carry_call_finishes_the_group_the_next_call_would_drop():
    """Prime: A = (1, 9), version 0. Call 0 admits B = (1, 1): B is handed on after 3 steps,
    A's long row has 6 left. Call 1 admits C = (1, 1): C goes after 2 steps, 4 left. Call 2
    (step 2, k = 2) admits D = (1, 1) with version 1; the call for step 3 keeps version 1 on,
    so A (version 0) is due: the call goes on after D completes until A's row ends, and hands
    A on. Nothing is left for the bound to drop."""
    m = _model(_carry_run(), lengths=Scripted([1, 9, 1, 1, 1, 1, 1, 1]))
    pipe = CarryPipeline(m, 2, Sink())
    pipe.fill(0, 0.0, 4)
    pipe.queue.pop(0)
    pipe.version = 1
    pipe.fill(1, 0.0, 4)  # submits step 2
    buf = pipe.buffers[0]
    assert [job.version for job in pipe.queue] == [0, 0]  # C, then A (both version 0)
    assert buf.held() == [3] and buf.carried_rows() == 0  # D complete, kept for step 3
    assert buf.run(0, oldest=1).dropped == ()


def test_the_bound_drops_groups_older_than_the_step_minus_k():
    """A group whose row never ends in time is dropped once its version is older than
    ``step - k``, and its prompt sampled again (the buffer keeps its surplus)."""
    buffer = CarryBuffer(slots=2, segment=1)
    buffer.admit(0, 0, [100, 100])
    buffer.admit(1, 3, [1, 1])
    done = buffer.run(1, oldest=1)
    assert done.dropped == (0,) and done.ready == (1,)


def test_carry_beats_finish_on_heavy_tailed_lengths():
    finish_run = _carry_run()
    finish_run = dataclasses.replace(
        finish_run, trainer=dataclasses.replace(finish_run.trainer, partial_rollout="finish")
    )
    finish = simulate(_model(finish_run), 20, "pipelined", 2, "finish")
    carry = simulate(_model(_carry_run()), 20, "pipelined", 2, "carry")
    # the deadline (a call finishes the groups the next one would drop) waits for long rows
    # at k = 2 instead of throwing them away: slower than without it, still faster than finish
    assert sum(_periods(carry)[2:]) < 0.9 * sum(_periods(finish)[2:])


def test_the_simulator_draws_the_lengths_the_rollout_draws():
    """Same length model and the same seeds as ``RolloutWorker``'s carry buffer
    (``Carry.admit``): a step's modelled lengths are the run's, not a resample."""
    run = _carry_run()
    m = _model(run)
    rng = random.Random(rollout_sampling_seed(run, 3, 0))
    assert m.draw_lengths(3, 0, 1) == simulated(4).sample(rng, 2)
    assert from_config(run) == simulated(4)


def test_plan_predicts_carry_and_ranks_it_at_its_least_staleness(tmp_path):
    from rltrain.bench.measures.trainer import compose

    run = compose(
        "placement=disaggregated",
        "trainer.max_staleness=2",
        "trainer.partial_rollout=carry",
        "simulate.response_length_median=8",
        "simulate.rollout_token_latency_ms=25",
        "simulate.actor_latency_ms=500",
    )
    assert unmodelled(run) == []
    plan_command(run, str(tmp_path / "plan"))
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert doc["predicted"]["schedule"] == "pipelined"
    ranking = {r["candidate"]: r for r in doc["predicted_ranking"]}
    # the user's policy, at the staleness it runs with (carry needs 2), ahead of the
    # synchronous split, whose every call waits for its longest row
    carry = ranking["disaggregated actor 0 rollout 1 async2 carry"]
    assert carry["step_s"] < 0.5 * ranking["disaggregated actor 0 rollout 1"]["step_s"]
    assert not any("async1 carry" in name for name in ranking)
