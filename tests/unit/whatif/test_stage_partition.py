"""A prediction's stages are disjoint, by hand: the rollout's reload, weight load and offload
are inside ``generate`` (as a generate timer that includes the switch measures them), the
actor's reload and offload are ``moves``, and the driver's time between steps is in none."""

from __future__ import annotations

import dataclasses

import pytest

from rltrain.config.schema import RunConfig
from rltrain.whatif.calibrate import Calibration
from rltrain.whatif.events import simulate
from rltrain.whatif.hardware import SIM
from rltrain.whatif.workload import Proc, StepModel

CAL = Calibration(
    call_s=0.0,
    overhead_s=0.1,
    fused_overhead_s=0.0,
    sync_s=0.02,
    reward_s=0.01,
    generate_extra_s=0.0,
    decode_step_s=0.0,
    train_extra_s=0.0,
    env_item_s=0.0,
    infer_item_s=0.0,
    epoch_extra_s=0.0,
    move_s=0.05,
)


def _model() -> StepModel:
    """Actor and rollout take turns on one device: 0.5 s a generation, 0.2 s an update, each
    moving its state off and back every step."""
    run = RunConfig()
    sim = dataclasses.replace(run.simulate, rollout_latency_ms=500.0, actor_latency_ms=200.0)
    on = ("node0/dev0",)
    procs = {
        "actor": (Proc("actor", 0, on, 0),),
        "rollout": (Proc("rollout", 0, on, 0),),
        "reward": (Proc("reward", 0, (), 0),),
    }
    return StepModel(
        dataclasses.replace(run, simulate=sim),
        procs,
        SIM,
        SIM.intra,
        CAL,
        shares=True,
        moved={"actor": 1000, "rollout": 2000},
    )


def test_turns_stages_are_disjoint_and_sum_to_the_step_less_the_driver():
    m = _model()
    sink = simulate(m, 3, "turns")
    r, a, load = m.move("rollout"), m.move("actor"), m.sync() / 2
    assert r > 0.05 and a > 0.05  # both move: the call's 0.05 s plus their bytes
    stages = sink.stage_s[1]  # step 1: the rollout loads the new weights first
    # generate: reload, load, 0.5 s, offload; moves: the actor's reload and offload only
    assert stages["generate"] == pytest.approx(r + load + 0.5 + r)
    assert stages["moves"] == pytest.approx(2 * a)
    assert stages["reward"] == pytest.approx(0.01)
    assert stages["train"] == pytest.approx(0.2)
    assert stages["sync"] == pytest.approx(load)
    period = sink.step_starts[2] - sink.step_starts[1]
    assert period == pytest.approx(0.5 + 2 * r + 2 * load + 0.01 + 2 * a + 0.2 + 0.1)
    assert sum(stages.values()) == pytest.approx(period - 0.1)  # the driver's 0.1 s: no stage
