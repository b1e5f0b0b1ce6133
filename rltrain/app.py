"""What a job does once Hydra has composed its config."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil

from omegaconf import DictConfig

from rltrain.config import load_config
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, RltrainError, WorkerError

log = logging.getLogger("rltrain")

#: What Hydra writes into a run directory before the job runs.
HYDRA_FILES = frozenset({".hydra", "rltrain.log"})


def run_dir() -> str:
    """The Hydra job's output directory (the current directory outside a Hydra run)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return os.getcwd()


def train(run_cfg: RunConfig, out_dir: str, layout=None) -> dict:
    """Run the training job the config describes and write its ``summary.json``.

    When a worker fails (it raised, its process died, its node left) and
    ``trainer.max_restarts`` allows, the job is torn down and started again from its latest
    checkpoint (the steps since it are redone and their records replaced); each restart is
    logged and listed in the summary under ``restarts``.

    Args:
        run_cfg: the checked run config.
        out_dir: the run directory.
        layout: the layout :func:`~rltrain.runners.layout.preflight` checked (None: checked
            here).

    Returns:
        The job summary.

    Raises:
        WorkerError: a worker failed and no restart is left.
    """
    from rltrain.telemetry.metrics import check_trackers
    from rltrain.telemetry.summary import write_job_summary

    check_trackers(run_cfg.logging)
    restarts: list[dict] = []
    attempt = run_cfg
    while True:
        try:
            summary = _train_once(attempt, out_dir, layout)
            break
        except WorkerError as exc:
            if len(restarts) >= run_cfg.trainer.max_restarts:
                raise
            restarts.append(_restart_point(run_cfg, out_dir, exc, len(restarts) + 1))
            trainer = dataclasses.replace(run_cfg.trainer, resume=restarts[-1]["checkpoint"])
            attempt = dataclasses.replace(run_cfg, trainer=trainer)
    if restarts:
        summary["restarts"] = restarts
    write_job_summary(out_dir, summary)
    print_summary(summary, out_dir)
    return summary


def _train_once(run_cfg: RunConfig, out_dir: str, layout) -> dict:
    if run_cfg.runner == "embodied":
        from rltrain.runners.embodied import run_embodied

        return run_embodied(run_cfg, out_dir, layout)
    from rltrain.runners.reasoning import run_reasoning

    return run_reasoning(run_cfg, out_dir, layout)


def _restart_point(run_cfg: RunConfig, out_dir: str, exc: WorkerError, count: int) -> dict:
    """Where restart ``count`` resumes: this run's latest checkpoint, else where it started."""
    import time

    from rltrain.runners.checkpoint import CheckpointManager, read_state
    from rltrain.telemetry.metrics import drop_records_from

    root = run_cfg.trainer.checkpoint_dir or os.path.join(out_dir, "checkpoints")
    checkpoint = CheckpointManager(root).latest() or run_cfg.trainer.resume
    step = int(read_state(checkpoint)["step"]) if checkpoint else 0
    drop_records_from(os.path.join(out_dir, "metrics.jsonl"), step)
    cause = str(exc).strip().splitlines()[0]
    log.warning(
        "restart %d of %d (trainer.max_restarts) after a worker failure: %s; resuming from %s",
        count,
        run_cfg.trainer.max_restarts,
        cause,
        f"step {step} ({checkpoint})" if checkpoint else "step 0 (no checkpoint yet)",
    )
    return {
        "count": count,
        "cause": cause,
        "resumed_from_step": step,
        "checkpoint": checkpoint,
        "time": time.time(),
    }


def print_summary(summary: dict, out_dir: str) -> None:
    """A one-screen summary of a finished run."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rltrain: {summary.get('status')} ({summary.get('placement_mode')})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key in ("steps", "wall_s", "steps_per_s", "final_reward", "final_accuracy", "final_return"):
        value = summary.get(key)
        if value is not None:
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    for stage, secs in sorted((summary.get("seconds_per_stage") or {}).items()):
        table.add_row(f"s/step {stage}", f"{secs:.4f}")
    console = Console(stderr=True)
    console.print(table)
    console.print(
        f"outputs: {out_dir} (metrics.jsonl, summary.json, reward_curve.png, "
        f"trace.json, checkpoints/)"
    )


def run(cfg: DictConfig) -> float | None:
    """Check the config and run the job it describes.

    Args:
        cfg: the composed Hydra config.

    Returns:
        The job's objective (for Hydra sweepers): its throughput, or None.

    Raises:
        ConfigError: when the config or the run's inputs fail a check; nothing has started yet.
        PlacementError / ResourceError: the placement cannot be laid out or does not fit.
    """
    _refuse_private_preset()
    run_cfg = load_config(cfg)
    out_dir = run_dir()
    if run_cfg.runner == "reasoning" and run_cfg.task.generate:
        from rltrain.tasks import prepare_task

        prepare_task(run_cfg)  # before the plan reads model.path's config.json
    if run_cfg.placement.mode == "auto":  # rltrain chooses: profile, predict, rank
        from rltrain.autoplace import choose

        choice = choose(run_cfg, out_dir)
        print(choice.text)
        if run_cfg.mode == "plan":
            return None
        run_cfg = choice.run  # the winner, a concrete layout; checked and run as any other
    if run_cfg.mode == "plan":
        from rltrain.runners.plan_command import plan_command

        plan_command(run_cfg, out_dir)
        return None
    from rltrain.runners.layout import preflight
    from rltrain.telemetry.summary import objective

    layout = preflight(run_cfg, out_dir)  # everything that can fail before Ray, at once
    if layout.resume_note:
        log.info(layout.resume_note)
    if run_cfg.trainer.resume == "auto":  # the runners resume from the checkpoint found here
        trainer = dataclasses.replace(run_cfg.trainer, resume=layout.resume)
        run_cfg = dataclasses.replace(run_cfg, trainer=trainer)
    return objective(train(run_cfg, out_dir, layout))


def _refuse_private_preset() -> None:
    """``experiment=_name`` selects a file that only holds what public presets share."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    choice = HydraConfig.get().runtime.choices.get("experiment")
    if choice and os.path.basename(str(choice)).startswith("_"):
        raise ConfigError(
            f"experiment={choice} is not a preset: files starting with '_' hold what the presets "
            f"share and place nothing; choose a preset (python -m rltrain --help lists them)"
        )


def refused_run(exc: RltrainError) -> bool:
    """Record a single run's refusal; say whether the caller should report it itself.

    The refusal goes into the run's ``rltrain.log``; a run directory holding nothing but what
    Hydra wrote before the job started is removed (with empty parents inside the working
    directory), so a refused command leaves nothing behind.

    Args:
        exc: the refusal.

    Returns:
        True for a single run (the caller prints the error and exits 2); False in a sweep,
        whose launcher records each job's failure.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN:
        return False
    path = run_dir()
    if not _remove_if_untouched(path):
        with open(os.path.join(path, "rltrain.log"), "a") as f:  # the terminal shows it once
            f.write(f"rltrain: refused: {exc}\n")
    return True


def _remove_if_untouched(path: str) -> bool:
    """Remove a run directory holding only Hydra's files; say whether it is gone."""
    if not os.path.isdir(path) or not set(os.listdir(path)) <= HYDRA_FILES:
        return False
    shutil.rmtree(path, ignore_errors=True)
    cwd = os.path.abspath(os.getcwd())
    parent = os.path.dirname(os.path.abspath(path))
    while parent.startswith(cwd + os.sep):
        try:
            os.rmdir(parent)  # only when empty
        except OSError:
            break
        parent = os.path.dirname(parent)
    return True
