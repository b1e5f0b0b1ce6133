"""Metrics: one JSON line per step, plus TensorBoard / W&B / MLflow when enabled and installed.

Metric names follow cleanrl's habit: ``section/name`` (``reward/mean``, ``loss/policy``,
``time/generate_s``, ``perf/tokens_per_s``, ``eval/accuracy``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from typing import Any

from rltrain.errors import ConfigError

#: Keys that hold timings; excluded when comparing runs for determinism.
TIMING_PREFIXES = ("time/", "perf/")

_TRACKERS = {
    "tensorboard": ("tensorboard", "pip install 'rltrain[track]' (or pip install tensorboard)"),
    "wandb": ("wandb", "pip install 'rltrain[track]' (or pip install wandb)"),
    "mlflow": ("mlflow", "pip install 'rltrain[track]' (or pip install mlflow)"),
}


def check_trackers(logging_cfg: Any) -> None:
    """Refuse, before anything starts, a tracker that is enabled but not installed.

    Raises:
        ConfigError: naming ``logging.<tracker>`` and the install command.
    """
    problems = []
    for key, (module, fix) in _TRACKERS.items():
        if getattr(logging_cfg, key, False) and importlib.util.find_spec(module) is None:
            problems.append(f"logging.{key}=true but {module} is not installed: {fix}")
    if problems:
        raise ConfigError(problems)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


class MetricsLogger:
    """Writes step records to ``metrics.jsonl`` and to the enabled trackers.

    Args:
        run_dir: the run's output directory.
        logging_cfg: the ``logging`` config section.
        config: the resolved run config (sent to W&B / MLflow as parameters).
        resume: append to an existing ``metrics.jsonl`` (a resumed run) instead of replacing it.
    """

    def __init__(
        self, run_dir: str, logging_cfg: Any, config: dict | None = None, resume: bool = False
    ) -> None:
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.cfg = logging_cfg
        self.records: list[dict[str, Any]] = []
        self._file = open(self.path, "a" if resume else "w") if logging_cfg.jsonl else None
        self._tb = self._wandb = self._mlflow = None
        if logging_cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if logging_cfg.wandb:
            import wandb

            self._wandb = wandb.init(project=logging_cfg.project, config=config, dir=run_dir)
        if logging_cfg.mlflow:
            import mlflow

            mlflow.set_experiment(logging_cfg.project)
            self._mlflow = mlflow.start_run()
            if config:
                mlflow.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})
        self._start = time.monotonic()

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Record one step's metrics; returns the record as written."""
        record = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        self.records.append(record)
        if self._file:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        numeric = {
            k: v
            for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
        }
        if self._tb:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb:
            self._wandb.log(numeric, step=step)
        if self._mlflow:
            import mlflow

            mlflow.log_metrics({k.replace("/", "_"): v for k, v in numeric.items()}, step=step)
        return record

    def progress(self, step: int, total: int, record: dict[str, Any]) -> None:
        """One short status line in the terminal (when ``logging.progress``)."""
        if not self.cfg.progress:
            return
        parts = [f"step {step}/{total}", f"{time.monotonic() - self._start:6.1f}s"]
        for key, label in (
            ("reward/mean", "reward"),
            ("eval/accuracy", "eval acc"),
            ("env/return_mean", "return"),
            ("loss/policy", "loss"),
            ("perf/tokens_per_s", "tok/s"),
        ):
            if record.get(key) is not None:
                parts.append(f"{label} {record[key]:.3g}")
        print(" | ".join(parts), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
        if self._tb:
            self._tb.close()
        if self._wandb:
            self._wandb.finish()
        if self._mlflow:
            import mlflow

            mlflow.end_run()


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def read_metrics(path: str) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file back into records."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def drop_records_from(path: str, step: int) -> int:
    """Remove the records of steps ``>= step`` from a ``metrics.jsonl`` (a restart redoes them).

    Args:
        path: the file; a missing file is left missing.
        step: the first step the resumed run records again.

    Returns:
        How many records were removed.
    """
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    keep = [line for line in lines if json.loads(line).get("step", -1) < step]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
    os.replace(tmp, path)
    return len(lines) - len(keep)


def without_timings(record: dict[str, Any]) -> dict[str, Any]:
    """A record minus its timing fields, for comparing two runs step by step."""
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}


def plot_curves(
    records: list[dict[str, Any]],
    path: str,
    keys: tuple[str, ...] = ("reward/mean", "eval/accuracy"),
) -> str | None:
    """Save a PNG of the given metrics over steps; returns the path, or None with no data."""
    series = {k: [(r["step"], r[k]) for r in records if r.get(k) is not None] for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k, pts in series.items():
        ax.plot(
            [p[0] for p in pts], [p[1] for p in pts], label=k, marker="." if len(pts) < 40 else None
        )
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
