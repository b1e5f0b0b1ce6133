"""Asynchronous rollout with bounded staleness (``trainer.max_staleness``), for real on Ray."""

from __future__ import annotations

import json
import pathlib
from contextlib import nullcontext
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config import load_config
from rltrain.config.store import register_configs
from rltrain.errors import ConfigError
from rltrain.runners.reasoning import GenerationPipeline, run_reasoning
from rltrain.telemetry.metrics import read_metrics

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"
# Generation and training each take >= 300 ms, so an overlap is a property of the schedule.
# The untrained policy rarely earns a reward; the entropy bonus moves the weights every step, so a
# stale batch's behaviour policy really differs from the actor's.
SHORT = (
    "algorithm.entropy_coef=0.01",
    "placement=disaggregated",
    "trainer.eval_every=0",
    "trainer.train_batch_size=4",
    "logging.progress=false",
    "rollout.latency_ms=300",
    "actor.latency_ms=300",
)


def compose_run(*overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=list(overrides)))


# ----------------------------------------------------------------------- the schedule, pure logic
class _Future:
    def wait(self) -> None:
        return None


class _FakeRunner:
    """Records what the pipeline submits; ``version`` is bumped by the test like an update."""

    def __init__(self) -> None:
        self.version = 0
        self.submitted: list[tuple[int, int, int]] = []  # (step, expect, version sent)
        self.job = self

    def stage(self, component: str):
        return nullcontext()

    def _submit_generation(self, step: int, expect: int) -> _Future:
        self.submitted.append((step, expect, self.version))
        return _Future()


def _schedule(k: int, steps: int, start: int = 0) -> tuple[_FakeRunner, list[int]]:
    runner = _FakeRunner()
    runner.version = start
    pipe = GenerationPipeline(runner, k)  # type: ignore[arg-type]
    pipe.reset(start, horizon=start + steps)
    versions = []
    for step in range(start, start + steps):
        pipe.fill(step)
        versions.append(pipe.take(step).version)
        runner.version = step + 1  # the update exports version step + 1
    assert not pipe.queue  # the horizon stops generation at the last step
    return runner, versions


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (1, [0, 0, 1, 2, 3, 4]),
        (2, [0, 0, 0, 1, 2, 3]),
        (3, [0, 0, 0, 0, 1, 2]),
    ],
)
def test_schedule_samples_with_versions_at_most_k_old(k, expected):
    runner, versions = _schedule(k, 6)
    assert versions == expected
    assert [s - v for s, v in enumerate(versions)] == [min(s, k) for s in range(6)]
    # the rollout is told to refuse anything older than step - k
    assert [e for _, e, _ in runner.submitted] == [max(s - k, 0) for s in range(6)]


def test_schedule_resumes_from_a_later_step():
    runner, versions = _schedule(1, 3, start=5)
    assert versions == [5, 5, 6]
    assert [s for s, _, _ in runner.submitted] == [5, 6, 7]


def test_schedule_refuses_a_skipped_step():
    from rltrain.errors import WorkerError

    pipe = GenerationPipeline(_FakeRunner(), 1)  # type: ignore[arg-type]
    pipe.fill(0)
    pipe.take(0)
    with pytest.raises(WorkerError, match="step 2 trains next"):
        pipe.take(2)


# ------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("placement", ["collocated", "hybrid"])
def test_staleness_is_refused_where_rollout_and_actor_share_a_device(placement, tmp_path):
    run = compose_run(f"placement={placement}", "trainer.max_staleness=1")
    with pytest.raises(ConfigError, match=f"trainer.max_staleness=1.*mode {placement}"):
        run_reasoning(run, str(tmp_path))  # refused by the plan check, before Ray starts


# ------------------------------------------------------------------------------ real runs
def _spans(run_dir: pathlib.Path, name: str, component: str) -> list[tuple[float, float]]:
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    # a span is drawn on its device lanes and its process lane: one interval each, deduplicated
    return sorted(
        {
            (e["ts"], e["ts"] + e["dur"])
            for e in events
            if e.get("ph") == "X" and e.get("name") == name and e.get("cat") == component
        }
    )


@pytest.fixture(scope="module")
def sync_run(ray_session, tmp_path_factory) -> list[dict[str, Any]]:
    ray_session.ensure()
    out = tmp_path_factory.mktemp("sync")
    run_reasoning(compose_run(*SHORT, "trainer.total_steps=2"), str(out))
    return read_metrics(str(out / "metrics.jsonl"))


@pytest.mark.timeout(300)
def test_max_staleness_zero_is_the_on_policy_synchronous_loop(sync_run):
    assert [r["step"] for r in sync_run] == [0, 1]
    assert not any(k.startswith("rollout/") for r in sync_run for k in r)
    # no behaviour log-probs: the ratio is exactly 1, so nothing is clipped and the KL is 0
    assert all(r["actor/approx_kl"] == 0.0 and r["actor/clip_frac"] == 0.0 for r in sync_run)


@pytest.mark.timeout(300)
def test_disaggregated_max_staleness_one_overlaps_and_bounds_staleness(
    sync_run, ray_session, tmp_path
):
    ray_session.ensure()
    run = compose_run(*SHORT, "trainer.total_steps=4", "trainer.max_staleness=1")
    summary = run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 4
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    staleness = [r["rollout/staleness"] for r in records]
    assert staleness == [0, 1, 1, 1] and max(staleness) <= run.trainer.max_staleness
    assert [r["step"] - r["rollout/weight_version"] for r in records] == staleness
    # step 0 samples with version 0 in both schedules: the same responses, the same rewards
    assert records[0]["reward/mean"] == sync_run[0]["reward/mean"]
    assert records[0]["response/length_mean"] == sync_run[0]["response/length_mean"]
    # stale batches are corrected against the behaviour policy: the ratio moves off 1
    assert all(r["actor/approx_kl"] > 0 for r in records[1:])
    # the rollout generated step t + 1 while the actor trained step t
    gens = _spans(tmp_path, "generate", "rollout")
    trains = _spans(tmp_path, "train", "actor")
    assert len(gens) == 4 and len(trains) == 4
    overlaps = [
        min(g_end, t_end) - max(g_start, t_start)
        for (g_start, g_end), (t_start, t_end) in zip(gens[1:], trains[:-1], strict=True)
    ]
    assert all(o > 0 for o in overlaps), overlaps
