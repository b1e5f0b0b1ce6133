"""Metrics: one JSON line per step, plus TensorBoard / W&B / MLflow when enabled and installed.

Metric names follow cleanrl's habit: ``section/name`` (``reward/mean``, ``loss/policy``,
``time/generate_s``, ``perf/tokens_per_s``, ``eval/accuracy``).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
import uuid
from typing import Any

from rltrain.telemetry import startup

#: Sections that hold timings or rates over them; excluded when comparing runs for determinism.
TIMING_PREFIXES = ("time/", "perf/")
#: The suffix of a key in seconds (``time/<stage>_s``) or per second (``perf/*_per_s``),
#: whatever its section (``actor/old_logprobs_s``).
TIMING_SUFFIX = "_s"


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
        self._bar: _LiveBar | _LineBar | None = None
        self._file = open(self.path, "a" if resume else "w") if logging_cfg.jsonl else None
        self._tb = self._wandb = self._mlflow = None
        if logging_cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if logging_cfg.wandb:
            import wandb

            self._wandb = wandb.init(
                project=logging_cfg.project,
                config=config,
                dir=run_dir,
                id=wandb_run_id(run_dir, resume),
                resume="allow",  # a resumed run continues its W&B run
            )
        if logging_cfg.mlflow:
            import mlflow

            mlflow.set_experiment(logging_cfg.project)
            self._mlflow = mlflow.start_run()
            if config:
                mlflow.log_params(mlflow_params(config))
        self._start = time.monotonic()

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Record one step's metrics; returns the record as written."""
        record = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        self.records.append(record)
        if len(self.records) == 1:
            startup.mark("first_step")
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
        """The run's progress in the terminal (when ``logging.progress``).

        On a terminal: one live bar (rich) with the step's key metrics. Elsewhere (a log file,
        CI): a line at the first step, at every tenth of the run, at each evaluation and at the
        end, so a log holds the curve without a line per step.
        """
        if not self.cfg.progress:
            return
        text = _status(record)
        if self._bar is None:
            from rich.console import Console

            from rltrain.telemetry.runlog import terminal

            console = Console(file=terminal(sys.stderr))  # redraws stay out of rltrain.log
            if console.is_terminal:
                self._bar = _LiveBar(console, total, self._start)
            else:
                self._bar = _LineBar(total, self._start)
        self._bar.update(step, text, evaluated=any(k.startswith("eval/") for k in record))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
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


#: The metrics the progress display shows, with their labels.
PROGRESS_KEYS = (
    ("reward/mean", "reward"),
    ("eval/accuracy", "eval acc"),
    ("env/return_mean", "return"),
    ("eval/return_mean", "eval return"),
    ("perf/tokens_per_s", "tok/s"),
)


def _status(record: dict[str, Any]) -> str:
    return " | ".join(
        f"{label} {record[key]:.3g}"
        for key, label in PROGRESS_KEYS
        if isinstance(record.get(key), (int, float))
    )


class _LiveBar:
    """One rich progress bar, redrawn in place."""

    def __init__(self, console: Any, total: int, start: float) -> None:
        self.lines = _LineBar(total, start)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]rltrain"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
        )
        self.task = self.progress.add_task("train", total=total, status="")
        self.progress.start()

    def update(self, step: int, status: str, evaluated: bool) -> None:
        self.progress.update(self.task, completed=step, status=status)
        line = self.lines.line(step, status, evaluated)
        if line:
            from rltrain.telemetry.runlog import log_only

            log_only(line)  # the run's log gets the lines a log file would

    def stop(self) -> None:
        self.progress.stop()


class _LineBar:
    """Progress as occasional lines, for logs."""

    def __init__(self, total: int, start: float) -> None:
        self.total, self.start = total, start
        self.every = max(1, total // 10)

    def line(self, step: int, status: str, evaluated: bool) -> str:
        """The line for ``step`` ("" at the steps the cadence skips)."""
        if step == 1 or step % self.every == 0 or evaluated or step == self.total:
            head = f"step {step}/{self.total} | {time.monotonic() - self.start:6.1f}s"
            return f"{head} | {status}" if status else head
        return ""

    def update(self, step: int, status: str, evaluated: bool) -> None:
        line = self.line(step, status, evaluated)
        if line:
            print(line, file=sys.stderr, flush=True)

    def stop(self) -> None:
        return None


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


#: The W&B run id of a run directory's runs, kept in it so that a resumed run logs on.
WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(run_dir: str, resume: bool) -> str:
    """The W&B run id this run logs to: the one ``run_dir`` keeps when the run resumes there,
    else a new one, kept for the runs that resume it.

    Args:
        run_dir: the run's output directory.
        resume: the run continues from a checkpoint (its metrics are appended).

    Returns:
        The id (16 hex digits).
    """
    path = os.path.join(run_dir, WANDB_ID_FILE)
    if resume and os.path.exists(path):
        with open(path) as f:
            kept = f.read().strip()
        if kept:
            return kept
    new = uuid.uuid4().hex[:16]
    with open(path, "w") as f:
        f.write(new + "\n")
    return new


#: What MLflow accepts in a parameter name (its name check); other characters become "_".
_MLFLOW_NAME = re.compile(r"[^/\w.\- :]")


def mlflow_params(config: dict[str, Any]) -> dict[str, str]:
    """The run config as MLflow parameters: dotted names (an RLinf combined key such as
    ``placement.component_placement.actor,rollout`` with its comma replaced, which MLflow's
    name check refuses) and values cut to MLflow's 250 characters."""
    return {_MLFLOW_NAME.sub("_", k): str(v)[:250] for k, v in _flatten(config).items()}


def read_metrics(path: str) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file back into records."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def drop_records_from(path: str, step: int) -> list[dict[str, Any]]:
    """Remove the records of steps ``>= step`` from a ``metrics.jsonl`` (a restart redoes them).

    Args:
        path: the file; a missing file is left missing.
        step: the first step the resumed run records again.

    Returns:
        The records kept (the steps before ``step``); empty for a missing file.
    """
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    kept = [(line, json.loads(line)) for line in lines]
    kept = [(line, r) for line, r in kept if r.get("step", -1) < step]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.writelines(line for line, _ in kept)
    os.replace(tmp, path)
    return [r for _, r in kept]


def is_timing(key: str) -> bool:
    """Whether metric ``key`` holds a wall-clock figure (seconds, or a rate over them), which
    differs between two runs of the same seeds."""
    return key.startswith(TIMING_PREFIXES) or key.endswith(TIMING_SUFFIX)


def without_timings(record: dict[str, Any]) -> dict[str, Any]:
    """A record minus its timing fields (:func:`is_timing`), for comparing two runs step by
    step.

    Args:
        record: one ``metrics.jsonl`` record.

    Returns:
        A copy without the timing keys.
    """
    return {k: v for k, v in record.items() if not is_timing(k)}


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
