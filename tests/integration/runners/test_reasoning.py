"""The distributed reasoning trainer, for real, on the session's local Ray (simulated devices)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from composed import composed_run as compose_run
from residency_probe import record_residency_counts

from rltrain.errors import ConfigError, ResourceError
from rltrain.runners.reasoning import run_reasoning
from rltrain.telemetry.metrics import read_metrics

# spread: each test may run in either process, except the three that read the module's runs
pytestmark = pytest.mark.spread
#: The unit of the tests that read the module's ``default_run`` and ``turns_run`` (one process
#: runs each once).
DEFAULT_RUN = pytest.mark.spread(unit="test_reasoning-default-run")

SHORT = (
    "trainer.total_steps=3",
    "trainer.eval_every=3",
    "trainer.train_batch_size=4",
    "logging.progress=false",
)


@pytest.fixture(scope="module")
def default_run(ray_session, tmp_path_factory):
    """``(summary, run dir)`` of the shipped default (``placement=collocated``, fused) for
    ``SHORT``: the collocated case of every placement mode and the fused side of fused vs
    turns are this one run."""
    ray_session.ensure()
    out = tmp_path_factory.mktemp("default_run")
    return run_reasoning(compose_run("placement=collocated", *SHORT), str(out)), out


@pytest.fixture(scope="module")
def turns_run(ray_session, tmp_path_factory):
    """``(summary, run dir, residency counts)`` of ``SHORT`` taking turns: actor and rollout
    offload after every stage of theirs (``after_stage``, so ``fuse=auto`` falls back to
    separate processes). One run serves the offload policy's counts and the turn-taking side of
    fused vs turns."""
    ray_session.ensure()
    out = tmp_path_factory.mktemp("turns_run")
    run = compose_run(
        "placement=collocated",
        "placement.offload.actor.when=after_stage",
        "placement.offload.rollout.when=after_stage",
        *SHORT,
    )
    with pytest.MonkeyPatch.context() as patch:
        counts = record_residency_counts(patch)
        summary = run_reasoning(run, str(out))
    return summary, out, counts


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "placement", [pytest.param("collocated", marks=DEFAULT_RUN), "disaggregated", "hybrid"]
)
def test_a_few_real_steps_in_every_placement_mode(placement, ray_session, tmp_path, request):
    if placement == "collocated":
        summary, tmp_path = request.getfixturevalue("default_run")
    else:
        ray_session.ensure()
        summary = run_reasoning(compose_run(f"placement={placement}", *SHORT), str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert summary["placement_mode"] == placement
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in records)
    assert records[-1]["eval/accuracy"] is not None
    # every key the run logged is in docs/training.md's metrics table
    doc = (Path(__file__).resolve().parents[3] / "docs" / "training.md").read_text()
    logged = {k for r in records for k in r if "/" in k}
    missing = logged - set(re.findall(r"`([a-z]+/[a-z_0-9]+)`", doc))
    assert not missing, f"not in docs/training.md: {sorted(missing)}"
    # the ledger never exceeded a device's capacity
    cap = 4 * 1024**3
    assert all(0 < b <= cap for b in summary["peak_memory_bytes_per_device"].values())
    # a complete checkpoint in HF format
    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    assert (tmp_path / "checkpoints" / latest / "model" / "model.safetensors").is_file()
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"generate", "train", "reward"} <= names


@DEFAULT_RUN
@pytest.mark.timeout(300)
def test_collocated_offloads_follow_the_policy(turns_run):
    """after_stage actor and rollout: each leaves its devices after every one of its stages."""
    _, _, seen = turns_run
    # per rank: rollout reloads once per generate (3) and per evaluation (1)
    assert seen[("rollout", "reload")] == 2 * (3 + 1)
    assert seen[("rollout", "offload")] == 2 * (3 + 1) + 2  # + the start-up offload
    assert seen[("actor", "offload")] >= 2 * 3


def test_missing_component_and_bad_batch_are_refused_before_ray(tmp_path):
    run = compose_run("algorithm.kl_coef=0.1")
    with pytest.raises(ConfigError, match="reference"):
        run_reasoning(run, str(tmp_path))
    run = compose_run("trainer.train_batch_size=3")
    with pytest.raises(ConfigError, match="trainer.train_batch_size=3"):
        run_reasoning(run, str(tmp_path))
    run = compose_run("cluster.device_memory_gib=0.001")
    with pytest.raises(ResourceError, match="device"):
        run_reasoning(run, str(tmp_path))


@DEFAULT_RUN
@pytest.mark.timeout(300)
def test_fused_collocated_learns_what_taking_turns_learns(default_run, turns_run):
    """placement.fuse: one process per device does generate, score and train; the rows and
    random streams are the separate workers', so the records match a turn-taking run's."""
    fused, fused_dir = default_run  # the shipped default: placement=collocated, fuse=auto
    # after_stage offload moves state between the stages: auto falls back to taking turns
    turns, turns_dir, _ = turns_run
    assert fused["fused"] is True and "fuse_blockers" not in fused
    assert turns["fused"] is False
    assert any("placement.offload.rollout.when" in b for b in turns["fuse_blockers"])
    a = read_metrics(str(fused_dir / "metrics.jsonl"))
    b = read_metrics(str(turns_dir / "metrics.jsonl"))
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2]
    for ra, rb in zip(a, b, strict=True):
        for key in ("reward/mean", "reward/std", "response/length_mean"):
            assert ra[key] == rb[key], key  # same samples, same rewards
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            # the turn-taking actor pads its rows to the widest rollout shard: float noise only
            assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-6), key
        assert {"time/generate_s", "time/reward_s", "time/train_s"} <= set(ra)
        # the parity check, fused or not: the sampler's log-probs are the trainer's (rounding)
        assert ra["rollout/logprob_gap_max"] <= 1e-5 and rb["rollout/logprob_gap_max"] <= 1e-5
    assert a[-1]["eval/accuracy"] == b[-1]["eval/accuracy"]
    trace = json.loads((fused_dir / "trace.json").read_text())
    processes = {e["args"]["process"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert processes == {"driver", "actor[0]", "actor[1]"}  # no rollout or reward processes
    latest = (fused_dir / "checkpoints" / "latest").read_text().strip()
    assert (fused_dir / "checkpoints" / latest / "model" / "model.safetensors").is_file()
