"""The training loop's records: the run's config handed to the trackers it logs to (W&B's
config, MLflow's params; a stand-in tracker module: what rltrain passes, not the tracker's own
code), and ``metrics.jsonl`` one row per step across a resume."""

from __future__ import annotations

import sys
import types
from typing import Any

from fit_stubs import StubRunner, StubSchedule

from rltrain.config.schema import RunConfig
from rltrain.runners import loop


def test_fit_sends_the_run_config_to_wandb(tmp_path, monkeypatch):
    seen: dict[str, Any] = {}

    class _Run:
        def log(self, numeric: dict[str, float], step: int) -> None:
            seen.setdefault("steps", []).append(step)

        def finish(self) -> None:
            seen["finished"] = True

    def init(**kwargs: Any) -> _Run:
        seen["init"] = kwargs
        return _Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    run = RunConfig()
    run.trainer.total_steps, run.trainer.eval_every = 2, 0
    run.logging.wandb, run.logging.progress, run.logging.project = True, False, "p"
    run.seed = 7

    summary = loop.fit(StubRunner(), StubSchedule(), run, str(tmp_path))

    assert summary["steps"] == 2 and summary["status"] == "completed"
    config = seen["init"]["config"]
    assert seen["init"]["project"] == "p"
    assert config["seed"] == 7 and config["trainer"]["total_steps"] == 2
    assert config["placement"]["component_placement"] == run.placement.component_placement
    assert seen["steps"] == [0, 1] and seen["finished"]


def test_fit_logs_the_run_config_as_mlflow_params_with_names_it_accepts(tmp_path, monkeypatch):
    import re

    logged: dict[str, Any] = {}

    def log_params(params: dict[str, str]) -> None:
        # MLflow's own name rule (mlflow.utils.validation): letters, digits, _ - . / space :
        bad = [k for k in params if not re.fullmatch(r"[/\w.\- :]*", k)]
        assert not bad, bad
        logged.update(params)

    stub = types.SimpleNamespace(
        set_experiment=lambda name: None,
        start_run=lambda: object(),
        log_params=log_params,
        log_metrics=lambda metrics, step: None,
        end_run=lambda: None,
    )
    monkeypatch.setitem(sys.modules, "mlflow", stub)
    run = RunConfig()
    run.trainer.total_steps, run.trainer.eval_every = 1, 0
    run.logging.mlflow, run.logging.progress = True, False
    run.placement.component_placement = {"actor,rollout": "all", "reward": {"placement": "0"}}

    loop.fit(StubRunner(), StubSchedule(), run, str(tmp_path))

    assert logged["placement.component_placement.actor_rollout"] == "all"
    assert logged["placement.component_placement.reward.placement"] == "0"
    assert logged["trainer.total_steps"] == "1"


def test_a_resumed_run_logs_on_to_its_wandb_run(tmp_path, monkeypatch):
    inits: list[dict[str, Any]] = []

    class _Run:
        def log(self, numeric: dict[str, float], step: int) -> None:
            pass

        def finish(self) -> None:
            pass

    def init(**kwargs: Any) -> _Run:
        inits.append(kwargs)
        return _Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    run = RunConfig()
    run.trainer.total_steps, run.trainer.eval_every = 2, 0
    run.logging.wandb, run.logging.progress = True, False
    loop.fit(StubRunner(), StubSchedule(), run, str(tmp_path))  # a fresh run: a new id, kept
    run.trainer.total_steps = 4
    # resumed from step 2: the same run
    loop.fit(StubRunner(start=2), StubSchedule(), run, str(tmp_path))
    loop.fit(StubRunner(), StubSchedule(), run, str(tmp_path))  # afresh again: a new W&B run
    ids = [i["id"] for i in inits]
    assert ids[0] == ids[1] != ids[2]
    assert all(i["resume"] == "allow" for i in inits)
    assert (tmp_path / "wandb_run_id").read_text().strip() == ids[2]


def test_a_run_resumed_after_a_cut_logs_each_step_once(tmp_path):
    # A run cut off after its step-2 checkpoint had logged steps 0-3; resumed from step 2,
    # it logs steps 2-3 again: they replace the old rows instead of following them.
    import json

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "reward/mean": -1.0}) + "\n" for s in range(4)))

    run = RunConfig()
    run.trainer.total_steps, run.trainer.eval_every = 5, 0
    run.logging.progress = False
    loop.fit(StubRunner(start=2), StubSchedule(), run, str(tmp_path))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["reward/mean"] for r in rows] == [-1.0, -1.0, 2.5, 3.5, 4.5]
