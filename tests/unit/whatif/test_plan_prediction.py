"""``mode=plan`` predicts the step: printed, in plan.json, a predicted trace; no Ray, no torch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from rltrain.config.schema import RunConfig
from rltrain.config.whatif_checks import whatif_problems
from rltrain.telemetry.draw import compare
from rltrain.telemetry.timeline import load_trace

PROBE = (
    "import sys; from rltrain.__main__ import main; sys.argv = ['rltrain', *sys.argv[1:]]; "
    "main(); print('HEAVY', sorted(m for m in ('ray', 'torch') if m in sys.modules))"
)


def plan_cli(tmp_path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["COLUMNS"] = "160"
    # an empty home: no profile the user's placement=auto runs cached calibrates the prediction
    env["HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [sys.executable, "-c", PROBE, "mode=plan", f"hydra.run.dir={tmp_path}", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_plan_predicts_the_configured_cluster_and_ranks_candidates(tmp_path):
    out = plan_cli(tmp_path, "simulate.rollout_latency_ms=600", "simulate.actor_latency_ms=200")
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    assert "predicted: " in out.stdout and "on sim (fused" in out.stdout
    assert "candidate (whatif ranking)" in out.stdout
    data = json.loads((tmp_path / "plan.json").read_text())
    p = data["predicted"]
    # 0.6 s of generation and 0.2 s of update per step, plus rltrain's own time
    assert 0.8 < p["step_s"] < 0.9
    assert set(p["idle_share"]) == {"node0/dev0", "node0/dev1"}
    assert set(p["tokens_per_s_per_device"]) == set(p["idle_share"])
    assert {"generate", "reward", "train"} <= set(p["stages_s"])
    ranking = data["predicted_ranking"]
    assert ranking[0]["candidate"] == "disaggregated actor 0 rollout 1 async1"  # overlaps
    assert {r["status"] for r in ranking} == {"ok"}
    # placement.auto.partial_rollout unset: the async split also with continue, which stops the
    # generation running at the swap and calls again (another 600 ms call latency): no gain
    steps = {r["candidate"]: r["step_s"] for r in ranking}
    assert len(ranking) == 6
    assert steps["disaggregated actor 0 rollout 1 async1 continue"] > ranking[0]["step_s"] * 1.2
    # plan files only (beside what Hydra itself writes)
    names = set(os.listdir(tmp_path)) - {".hydra", "rltrain.log", ".rltrain_run"}
    assert names == {"plan.json", "plan.svg", "plan_trace.json"}
    doc = load_trace(tmp_path / "plan_trace.json")
    assert doc["otherData"]["predicted"] is True
    assert "s/step" in compare(doc, doc) and "+0.0%" in compare(doc, doc)


def test_plan_on_catalogue_hardware(tmp_path):
    out = plan_cli(
        tmp_path,
        "cluster=ray",
        "cluster.num_nodes=2",
        "model=qwen2_0_5b",
        "whatif.hardware=h100",
        "whatif.link=roce",
        "whatif.response_length=lognormal",
        "rollout.max_new_tokens=1024",
        "trainer.train_batch_size=64",
        "actor.micro_batch_size=4",
        "whatif.rank_candidates=false",
    )
    assert out.returncode == 0, out.stderr
    assert "what if (h100):" in out.stdout
    p = json.loads((tmp_path / "plan.json").read_text())["predicted"]
    assert p["hardware"] == "h100" and len(p["idle_share"]) == 16
    assert "predicted_ranking" not in json.loads((tmp_path / "plan.json").read_text())


def test_unknown_hardware_is_refused_before_anything_runs(tmp_path):
    out = plan_cli(tmp_path, "whatif.hardware=h1000")
    assert out.returncode == 2
    assert "whatif.hardware='h1000' is not in the catalogue" in out.stderr
    assert "'h100'" in out.stderr and "'l40s'" in out.stderr
    assert not (tmp_path / "plan.json").exists()


def _w(**kw):
    run = RunConfig()
    return dataclasses.replace(run, whatif=dataclasses.replace(run.whatif, **kw))


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"link": "infiniband"}, "whatif.link='infiniband' describes the network"),
        ({"link": "carrier-pigeon", "hardware": "h100"}, "whatif.link='carrier-pigeon'"),
        ({"steps": 1}, "whatif.steps=1"),
        ({"train_utilization": 1.5, "hardware": "h100"}, "whatif.train_utilization=1.5"),
        ({"train_utilization": 0.5}, "whatif.train_utilization=0.5 scales the roofline of"),
        ({"response_length": "zipf"}, "whatif.response_length='zipf'"),
        ({"response_length_mean": 10.0}, "only shapes whatif.response_length=lognormal"),
        ({"response_length_sigma": 0.0}, "whatif.response_length_sigma=0.0"),
    ],
)
def test_bad_whatif_values_are_named(kw, needle):
    problems = list(whatif_problems(_w(**kw)))
    assert any(needle in p for p in problems), problems


def test_train_utilization_without_hardware_is_refused():
    # simulated devices ignore it (their time is simulate.*), as they would whatif.link
    (problem,) = whatif_problems(_w(train_utilization=0.5))
    assert problem == (
        "whatif.train_utilization=0.5 scales the roofline of whatif.hardware, which is not set "
        "(simulated devices take their time from simulate.*): set whatif.hardware too, or drop "
        "whatif.train_utilization (default 0.4)"
    )
    assert list(whatif_problems(_w(train_utilization=0.5, hardware="h100"))) == []
    assert list(whatif_problems(_w())) == []


def test_simulated_device_time_with_catalogue_hardware_is_refused():
    run = _w(hardware="h100")
    run = dataclasses.replace(
        run, simulate=dataclasses.replace(run.simulate, rollout_latency_ms=100.0)
    )
    problems = list(whatif_problems(run))
    assert problems and "simulate.rollout_latency_ms=100.0 models device time" in problems[0]
    assert list(whatif_problems(_w(hardware="h100"))) == []


def test_plan_refuses_length_aware_dispatch_on_catalogue_hardware_before_writing(tmp_path):
    from rltrain.errors import ConfigError
    from rltrain.runners.plan_command import plan_command
    from rltrain.whatif.events import unmodelled

    run = RunConfig()
    run.trainer.max_staleness = 1
    run.trainer.sampler = "fifo"  # modelled (tests/unit/whatif/test_pool_plan.py)
    run.rollout.dispatch = "length_aware"
    assert unmodelled(run) == []  # simulated devices: a call lasts its longest modelled row
    run.whatif.hardware = "h100"
    with pytest.raises(ConfigError) as err:
        plan_command(run, str(tmp_path / "plan"))
    assert [p.split(":")[0] for p in err.value.problems] == [
        "rollout.dispatch='length_aware' with whatif.hardware='h100'"
    ]
    assert "plan with rollout.dispatch=in_order" in err.value.problems[0]
    assert not (tmp_path / "plan").exists()
