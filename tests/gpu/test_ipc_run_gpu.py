"""The CUDA-IPC weight-sync transport inside a real run: collocated actor and rollout processes
on one GPU (separate processes: placement.fuse=false), 3 steps (skipped without CUDA or Ray)."""

from __future__ import annotations

import json
import pathlib

import pytest

pytestmark = pytest.mark.gpu

CONF = pathlib.Path(__file__).resolve().parents[2] / "conf"


def test_collocated_run_syncs_weights_over_cuda_ipc(tmp_path) -> None:
    pytest.importorskip("ray")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rltrain.config import load_config
    from rltrain.config.store import register_configs
    from rltrain.runners.reasoning import run_reasoning
    from rltrain.telemetry.metrics import read_metrics

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                "placement=collocated",
                "placement.fuse=false",
                "cluster.devices_per_node=1",
                "trainer.total_steps=3",
                "trainer.eval_every=3",
                "trainer.train_batch_size=4",
                "logging.progress=false",
            ],
        )
    summary = run_reasoning(load_config(cfg), str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert summary["simulated_devices"] is False
    assert summary["weight_sync"]["rollout"]["transport"] == "ipc"
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 2]
    trace = json.loads((tmp_path / "trace.json").read_text())
    syncs = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name") == "sync"]
    assert {e["args"]["process"] for e in syncs} >= {"actor[0]", "rollout[0]"}
