"""A continued generate call on a simulated device, by hand: the rollout worker decodes its
rows first and pays the call's fixed cost (``simulate.rollout_latency_ms``) last, so a call
stopped during its decoding keeps the steps made and one stopped in its fixed cost keeps all
of them; either way the continued call pays the fixed cost again."""

from __future__ import annotations

import dataclasses

import pytest

from rltrain.config.schema import RunConfig
from rltrain.whatif.calibrate import Calibration
from rltrain.whatif.hardware import SIM
from rltrain.whatif.workload import Proc, StepModel

CAL = Calibration(
    call_s=0.0,
    overhead_s=0.0,
    fused_overhead_s=0.0,
    sync_s=0.0,
    reward_s=0.0,
    generate_extra_s=0.0,
    decode_step_s=0.0,
    train_extra_s=0.0,
    env_item_s=0.0,
    infer_item_s=0.0,
    epoch_extra_s=0.0,
)


def _model() -> StepModel:
    """100 ms a call, 25 ms per modelled token: 8 tokens are 0.2 s of decoding, a call 0.3 s."""
    run = RunConfig()
    sim = dataclasses.replace(run.simulate, rollout_latency_ms=100.0, rollout_token_latency_ms=25.0)
    procs = {
        "actor": (Proc("actor", 0, ("node0/dev0",), 0),),
        "rollout": (Proc("rollout", 0, ("node0/dev1",), 0),),
    }
    return StepModel(dataclasses.replace(run, simulate=sim), procs, SIM, SIM.intra, CAL)


def test_a_call_stopped_mid_decoding_decodes_the_rest_then_pays_its_latency():
    # stopped 0.15 s in: 0.15 of the 0.2 s decoding done; 0.05 s left, then 0.1 s latency
    # (the worker measured 0.149 s)
    assert _model().continue_generate(0.3, 0.15, 1) == pytest.approx(0.05 + 0.1)


def test_a_call_stopped_in_its_latency_pays_only_the_latency_again():
    # stopped 0.25 s in: decoding (0.2 s) done, 0.05 s of the latency run and lost
    assert _model().continue_generate(0.3, 0.25, 1) == pytest.approx(0.1)


def test_a_call_stopped_at_once_decodes_everything():
    assert _model().continue_generate(0.3, 0.0, 1) == pytest.approx(0.3)
