"""A real short run and its prediction have the same shape: the same devices, the same stages
in the same order (the structure, not the seconds: times on a shared CPU machine vary)."""

from __future__ import annotations

import pytest

from rltrain.bench.measures.whatif import predicted, same_cycle, stage_order
from rltrain.runners.reasoning import run_reasoning
from rltrain.telemetry.timeline import load_trace, trace_devices

from .test_reasoning import compose_run

pytestmark = pytest.mark.spread  # no module fixture: each test may run in either process

SHORT = (
    "placement=disaggregated",
    "trainer.eval_every=0",
    "trainer.train_batch_size=2",
    "rollout.n_samples_per_prompt=2",
    "rollout.max_new_tokens=1",
    "logging.progress=false",
    "simulate.rollout_latency_ms=200",
    "simulate.actor_latency_ms=200",
    "trainer.total_steps=4",
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("staleness", [0, 1])
def test_prediction_has_the_runs_devices_and_stage_order(staleness, ray_session, tmp_path):
    ray_session.ensure()
    run = compose_run(*SHORT, f"trainer.max_staleness={staleness}")
    run_reasoning(run, str(tmp_path))
    measured = load_trace(tmp_path)
    prediction, order = predicted(run)
    assert trace_devices(measured) == trace_devices(prediction.trace)
    assert same_cycle(stage_order(measured), order), (stage_order(measured), order)
    # the actor trains and exports on device 0; the rollout loads and generates on device 1
    assert [o.split(": ")[0] for o in order] == ["node0/dev0", "node0/dev1"]
    assert set(order[0].split(": ")[1].split(" > ")) == {"train", "sync"}
    assert set(order[1].split(": ")[1].split(" > ")) == {"sync", "generate"}
