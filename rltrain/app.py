"""What a job does once Hydra has composed its config."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from rltrain.config import load_config
from rltrain.config.schema import RunConfig


def run_dir() -> str:
    """The Hydra job's output directory (the current directory outside a Hydra run)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return os.getcwd()


def train(run_cfg: RunConfig, out_dir: str) -> dict:
    """Run the training job the config describes and write its ``summary.json``.

    Returns:
        The job summary.
    """
    from rltrain.telemetry.metrics import check_trackers
    from rltrain.telemetry.summary import write_job_summary

    check_trackers(run_cfg.logging)
    if run_cfg.runner == "embodied":
        from rltrain.runners.embodied import run_embodied

        summary = run_embodied(run_cfg, out_dir)
    else:
        from rltrain.runners.reasoning import run_reasoning

        summary = run_reasoning(run_cfg, out_dir)
    write_job_summary(out_dir, summary)
    print_summary(summary, out_dir)
    return summary


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
        ConfigError: when the config fails a check; nothing has started yet.
    """
    run_cfg = load_config(cfg)
    if run_cfg.mode == "plan":
        from rltrain.placement.command import plan_command

        plan_command(run_cfg)
        return None
    from rltrain.telemetry.summary import objective

    return objective(train(run_cfg, run_dir()))
