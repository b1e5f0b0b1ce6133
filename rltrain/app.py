"""What a job does once Hydra has composed its config."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, PlacementError, RltrainError, WorkerError, worker_cause
from rltrain.telemetry import startup

log = logging.getLogger("rltrain")

#: Marks a directory a run has written its outputs into: a later run may replace them there.
RUN_STAMP = ".rltrain_run"
#: What Hydra and the run log write into a run directory before the job runs, with rltrain's
#: primary config (:func:`hydra_files` has a run's own): what a refused run removes, when it
#: created them and the directory holds nothing else.
HYDRA_FILES = frozenset({".hydra", "rltrain.log"})
#: What runs write into their run directory (train, mode=plan, placement=auto).
RUN_OUTPUTS = (
    "metrics.jsonl",
    "summary.json",
    "reward_curve.png",
    "trace.json",
    "trace.png",
    "utilization.json",
    "checkpoints",
    "plan.json",
    "plan.svg",
    "plan_trace.json",
    "auto_placement.json",
    "auto_placement.txt",
    "auto_profile",
    "tensorboard",  # logging.tensorboard
    "wandb",  # logging.wandb: W&B's own files, and the run id a resumed run logs on with
    "wandb_run_id",
    # what the atomic writes of the files above pass through
    "metrics.jsonl.tmp",
    "summary.json.tmp",
    "trace.json.tmp",
    "utilization.json.tmp",
)


def hydra_files() -> frozenset[str]:
    """What Hydra and the run log write into this run's directory before the job runs.

    Hydra's ``hydra.output_subdir`` (``.hydra/``) and the log named after the job
    (``hydra.job.name``): ``rltrain.log`` with rltrain's primary config, ``__main__.log`` with a
    primary config of the user's own that does not name the job.

    Returns:
        Their names (:data:`HYDRA_FILES` outside a Hydra run).
    """
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return HYDRA_FILES
    hydra = HydraConfig.get()
    return frozenset({hydra.output_subdir or ".hydra", _log_name()})


def _log_name() -> str:
    """The run log's file name: the job's (``hydra.job.name``), as Hydra names its log."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return "rltrain.log"
    return f"{HydraConfig.get().job.name}.log"


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
    logged and listed in the summary under ``restarts``, and the summary describes the whole
    run (every attempt). A deterministic failure is not retried: a worker raising a
    configuration or programming error (:data:`DETERMINISTIC`), or the same error at the same
    step as the previous attempt, ends the run at once.

    A run that ends with an exception (a failure, Ctrl-C) still writes its ``summary.json``,
    with ``status`` ``failed`` (and the one-line ``cause``) or ``interrupted`` and the steps it
    finished, and draws ``reward_curve.png`` again from ``metrics.jsonl``; an earlier
    invocation's timeline files (``trace.json``, ``utilization.json``, ``trace.png``), which
    only a completed run writes, are removed. None of this replaces the exception raised.

    SIGTERM at any moment of the call stops the run cleanly: during a step, the step finishes
    and is checkpointed; before the first step (Ray, the workers or the resumed checkpoint
    starting), the run stops there; either way with ``status`` ``stopped`` and no exception.

    Args:
        run_cfg: the checked run config.
        out_dir: the run directory.
        layout: the layout :func:`~rltrain.runners.layout.preflight` checked (None: checked
            here).

    Returns:
        The job summary.

    Raises:
        WorkerError: a worker failed and no restart is left, or restarting cannot help.
        KeyboardInterrupt: Ctrl-C (also when a failure surfaced while it was being handled).
    """
    from rltrain.scheduler.interrupts import termination_requests

    with termination_requests():  # SIGTERM, whenever it comes, stops the run cleanly
        return _train(run_cfg, out_dir, layout)


def _train(run_cfg: RunConfig, out_dir: str, layout) -> dict:
    """:func:`train`, with SIGTERM recorded."""
    import time

    from rltrain.telemetry.summary import across_attempts, write_job_summary

    # A process killed while saving (SIGKILL, a lost machine) left its temporary writes: they
    # are removed, never one a live run sharing the directory is writing now, and nothing
    # published is touched.
    _discard_unpublished(run_cfg, out_dir)
    started = time.time()  # outputs older than this are an earlier invocation's
    restarts: list[dict] = []
    attempts: list[dict] = []
    try:
        summary = _attempts(run_cfg, out_dir, layout, attempts, restarts)
    except BaseException as exc:
        _write_ended(run_cfg, out_dir, exc, attempts, restarts, started)
        raise
    if restarts:
        staleness = run_cfg.trainer.max_staleness
        summary = across_attempts(summary, _records(out_dir), attempts, staleness)
        summary["restarts"] = restarts
    _remove_stale_timeline(out_dir, started)
    write_job_summary(out_dir, summary)
    print_summary(summary, out_dir)
    return summary


def _attempts(
    run_cfg: RunConfig, out_dir: str, layout, attempts: list[dict], restarts: list[dict]
) -> dict:
    """Train, restarting from the latest checkpoint after each failure a restart may cure
    (:func:`train`); ``attempts`` and ``restarts`` are filled in as they happen, so a caller
    whose call raised still has them. SIGTERM before an attempt's first step (between
    attempts too) ends the run there as ``stopped``.

    Returns:
        The last attempt's summary.

    Raises:
        WorkerError: a worker failed and no restart is left, or restarting cannot help.
        KeyboardInterrupt: Ctrl-C.
    """
    import signal
    import time

    from rltrain.runners import loop
    from rltrain.scheduler.interrupts import (
        check_interrupt,
        interrupted,
        listen_for_termination,
        terminated,
        termination_requested,
    )

    attempt = run_cfg
    while True:
        check_interrupt()  # never a restart after Ctrl-C, even one whose exception was dropped
        began = time.monotonic()
        loop.LAST_FIT.clear()  # a failure before the first step leaves it empty
        if attempts and termination_requested():
            # SIGTERM while the failed attempt was torn down: the restart never starts, so it
            # is not one the run spent
            restarts.pop()
            attempts.append(_attempt(len(attempts) + 1, began, "stopped"))
            stop = SystemExit(signal.SIGTERM)
            return _stopped_before_steps(run_cfg, out_dir, stop, attempts, restarts)
        try:
            summary = _train_once(attempt, out_dir, layout)
            attempts.append(_attempt(len(attempts) + 1, began, str(summary.get("status"))))
            return summary
        except BaseException as exc:
            listen_for_termination()  # a ray.init cut short leaves Ray's handler installed
            _discard_unpublished(run_cfg, out_dir)
            if terminated(exc) and not interrupted(exc):
                # SIGTERM while Ray started: Ray's handler raised SystemExit(15) there. The run
                # stops before its first step, as the loop stops it during the rest of start-up
                attempts.append(_attempt(len(attempts) + 1, began, "stopped"))
                return _stopped_before_steps(run_cfg, out_dir, exc, attempts, restarts)
            attempts.append(_ended_attempt(len(attempts) + 1, began, exc))
            if interrupted(exc) and not isinstance(exc, KeyboardInterrupt):
                raise KeyboardInterrupt from exc  # the interrupt, not what failed meanwhile
            if not isinstance(exc, WorkerError) or termination_requested():
                raise  # SIGTERM asked to stop: no restart after a failure either
            attempts[-1]["failed_step"] = attempts[-1]["done_steps"]  # running when it failed
            _stop_if_deterministic(run_cfg, exc, attempts, restarts)
            if len(restarts) >= run_cfg.trainer.max_restarts:
                raise
            restarts.append(_restart_point(run_cfg, out_dir, exc, len(restarts) + 1))
            trainer = dataclasses.replace(run_cfg.trainer, resume=restarts[-1]["checkpoint"])
            attempt = dataclasses.replace(run_cfg, trainer=trainer)


def _stopped_before_steps(
    run_cfg: RunConfig, out_dir: str, exc: BaseException, attempts: list[dict], restarts: list
) -> dict:
    """The summary of a run SIGTERM stopped before an attempt's first step: status
    ``stopped``, the steps earlier attempts of this invocation finished."""
    log.warning("SIGTERM before the first step of attempt %d: stopping", len(attempts))
    summary = ended_summary(run_cfg, exc, attempts, restarts, _records(out_dir))
    summary.pop("cause", None)
    summary["status"] = "stopped"
    return summary


def ended_summary(
    run_cfg: RunConfig,
    exc: BaseException,
    attempts: list[dict],
    restarts: list[dict],
    records: list[dict],
) -> dict:
    """The summary of a run that ended with an exception: what this invocation did.

    Args:
        run_cfg: the checked run config.
        exc: what ended the run.
        attempts: this invocation's attempts, oldest first (as :func:`train` keeps them).
        restarts: its restarts (as :func:`train` keeps them).
        records: the run directory's ``metrics.jsonl`` records (an earlier invocation's steps,
            before a resume, are left out).

    Returns:
        ``status`` ``interrupted`` (Ctrl-C) or ``failed`` with ``cause`` (the exception in one
        line); ``steps``, the rates and the stage means over the steps this invocation finished
        (:func:`~rltrain.telemetry.summary.across_attempts`), ``final_reward`` and
        ``final_accuracy`` of its last records, ``attempts`` and ``restarts``; and the runner's
        own fields over those steps (its kind's ``ended_fields``: an embodied run's three
        stages, ``env_steps_per_s``, ``final_return``, ``env_id``).
    """
    from rltrain.kinds import registry
    from rltrain.kinds.records import load
    from rltrain.scheduler.interrupts import interrupted
    from rltrain.telemetry.summary import across_attempts, this_invocations

    status = "interrupted" if interrupted(exc) else "failed"
    last = {"placement_mode": run_cfg.placement.mode, "steps": 0, "status": status}
    summary = across_attempts(last, records, attempts, run_cfg.trainer.max_staleness)
    firsts = [a["first_step"] for a in attempts if a.get("first_step") is not None]
    mine = this_invocations(records, min(firsts) if firsts else None)
    summary["final_reward"] = mine[-1].get("reward/mean") if mine else None
    summary["final_accuracy"] = next(
        (r["eval/accuracy"] for r in reversed(mine) if "eval/accuracy" in r), None
    )
    own = registry.runner(run_cfg).ended_fields
    if own is not None:  # the runner's own fields, as its finished runs write them
        summary.update(load(own)(run_cfg, [r for r in mine if "step" in r], summary))
    if status == "failed":
        summary["cause"] = _reason(exc)
    if restarts:
        summary["restarts"] = restarts
    return summary


def _write_ended(
    run_cfg: RunConfig,
    out_dir: str,
    exc: BaseException,
    attempts: list[dict],
    restarts: list[dict],
    started: float,
) -> None:
    """Replace what an earlier invocation left in the run directory with what this one, ended
    by ``exc``, did (:func:`ended_summary`); best effort: the exception is what is reported."""
    from rltrain.telemetry.metrics import plot_curves
    from rltrain.telemetry.summary import write_job_summary

    _remove_stale_timeline(out_dir, started)
    try:
        records = _records(out_dir)
        summary = ended_summary(run_cfg, exc, attempts, restarts, records)
        path = write_job_summary(out_dir, summary)
        log.info("%s: %s after %s step(s)", path, summary["status"], summary.get("steps"))
        curve = os.path.join(out_dir, "reward_curve.png")
        if plot_curves(records, curve) is None:
            _remove_if_older(curve, started)
    except Exception as err:  # noqa: BLE001 - must not replace the failure being raised
        log.warning("could not write the summary of the ended run into %s: %s", out_dir, err)


#: Outputs only a completed run writes (with ``logging.trace=true``; ``trace.png`` on request).
TIMELINE_OUTPUTS = ("trace.json", "utilization.json", "trace.png")


def _remove_stale_timeline(out_dir: str, started: float) -> None:
    """Remove the timeline files an earlier invocation left (this one did not write them)."""
    for name in TIMELINE_OUTPUTS:
        _remove_if_older(os.path.join(out_dir, name), started)


def _remove_if_older(path: str, started: float) -> None:
    """Remove ``path`` when it was written before ``started`` (``time.time()``)."""
    try:
        if os.path.getmtime(path) < started:
            os.remove(path)
    except OSError:
        return  # not there, or not ours to remove: what it holds is older, not wrong


def _ended_attempt(n: int, began: float, exc: BaseException) -> dict:
    """The record of an attempt ``exc`` ended: ``interrupted``, or ``failed`` with its cause."""
    from rltrain.scheduler.interrupts import interrupted

    if interrupted(exc):
        return _attempt(n, began, "interrupted")
    return _attempt(n, began, "failed", cause=_reason(exc))


def _reason(exc: BaseException) -> str:
    """What ended a run, in one line (a worker's failure as :func:`_cause` has it)."""
    if isinstance(exc, WorkerError):
        return _cause(exc)
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}".strip().rstrip(":")


#: Exceptions a worker raises the same way on every replay of a step: resuming is exact (same
#: data, same seeds), so a restart would only pay the start-up again.
DETERMINISTIC = (
    ConfigError,
    PlacementError,
    TypeError,
    AttributeError,
    NameError,
    ImportError,
    NotImplementedError,
    SyntaxError,
    AssertionError,
)


def _cause(exc: WorkerError) -> str:
    """What failed, in one line: the worker's exception type and message, or its death."""
    inner = worker_cause(exc)
    if inner is not None:
        text = (str(inner).strip().splitlines() or [""])[-1]
        return f"{type(inner).__name__}: {text}".strip().rstrip(":") + f" in {exc.where}"
    return (str(exc).strip().splitlines() or ["a worker failed"])[0].rstrip(":")


def _signature(cause: str) -> str:
    """A cause without the numbers that change between attempts (pids, addresses, ids)."""
    import re

    return re.sub(r"0x[0-9a-f]+|\b[0-9a-f]{12,}\b|\d+", "#", cause)


def _attempt(n: int, began: float, status: str, cause: str = "") -> dict:
    """One attempt's record: its steps and training seconds (from the loop), wall seconds."""
    import time

    from rltrain.runners.loop import last_fit

    progress = last_fit()
    record = {
        "attempt": n,
        "status": status,
        "first_step": progress.first_step if progress else None,
        "done_steps": progress.done_steps if progress else None,
        "training_s": progress.seconds if progress else 0.0,
        "wall_s": time.monotonic() - began,
    }
    if cause:
        record["cause"] = cause
    return record


def _stop_if_deterministic(
    run_cfg: RunConfig, exc: WorkerError, attempts: list[dict], restarts: list[dict]
) -> None:
    """End the run now when a restart would fail the same way.

    Raises:
        WorkerError: naming the failure and why it is not retried (only when
            ``trainer.max_restarts`` would otherwise retry it).
    """
    if len(restarts) >= run_cfg.trainer.max_restarts:
        return  # nothing would be spent: the failure is reported as it is
    inner = worker_cause(exc)
    why = ""
    if isinstance(inner, DETERMINISTIC):
        why = (
            f"a {type(inner).__name__} raised by a worker fails the same way on every replay "
            f"(resuming is exact)"
        )
    elif len(attempts) >= 2:
        before, now = attempts[-2], attempts[-1]
        same = _signature(before.get("cause", "")) == _signature(now.get("cause", ""))
        if same and before.get("failed_step") == now.get("failed_step"):
            why = f"the same failure happened at step {now.get('failed_step')} twice"
    if why:
        raise WorkerError(
            f"not restarting (trainer.max_restarts={run_cfg.trainer.max_restarts}, "
            f"{len(restarts)} used): {why}: fix the cause: {attempts[-1].get('cause')}\n{exc}"
        ) from None


def _discard_unpublished(run_cfg: RunConfig, out_dir: str) -> None:
    """Remove checkpoint writes that interrupted or failed attempts left unpublished: every one
    in the run directory's own ``checkpoints/`` (the run directory is this run's, whichever
    host or container the killed driver ran on); in a ``trainer.checkpoint_dir`` other runs
    may share, this process's and those of gone processes of this host, never a live run's."""
    from rltrain.runners.checkpoint import CheckpointManager, checkpoint_root

    root = checkpoint_root(run_cfg, out_dir)
    try:
        manager = CheckpointManager(root)
        removed = manager.discard_unpublished(own=not run_cfg.trainer.checkpoint_dir)
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the failure being raised
        log.warning("could not remove unpublished checkpoint writes under %s: %s", root, exc)
        return
    if removed:
        log.info("removed unpublished checkpoint writes: %s", ", ".join(removed))


def _records(out_dir: str) -> list[dict]:
    from rltrain.telemetry.metrics import read_metrics

    path = os.path.join(out_dir, "metrics.jsonl")
    return read_metrics(path) if os.path.exists(path) else []


def _language_model(run_cfg: RunConfig) -> bool:
    """Whether the run's runner kind trains a language model (its task may be generated)."""
    from rltrain.kinds import registry

    return registry.runner(run_cfg).language_model


def _train_once(run_cfg: RunConfig, out_dir: str, layout) -> dict:
    from rltrain.kinds import registry
    from rltrain.kinds.records import load
    from rltrain.scheduler.cluster import Cluster
    from rltrain.scheduler.interrupts import listen_for_termination

    entry = registry.runner(run_cfg).entry
    # The attempt's Ray: the job joins it and removes what it created; Ray stops here. While
    # Ray starts (seconds mostly spent waiting for its processes) the runner's imports run.
    with Cluster.start(run_cfg.cluster, meanwhile=lambda: load(entry)):
        listen_for_termination()  # ray.init installed its own SIGTERM handler (SystemExit(15))
        return load(entry)(run_cfg, out_dir, layout)


def _restart_point(run_cfg: RunConfig, out_dir: str, exc: WorkerError, count: int) -> dict:
    """Where restart ``count`` resumes: this run's newest intact checkpoint (one written with
    its experiment and training settings, whatever ``latest`` names: a run sharing the
    directory may move it), else where the run started (``trainer.resume`` as it resolved)."""
    import time

    from rltrain.runners.checkpoint import (
        CheckpointManager,
        checkpoint_root,
        read_state,
        resolve_resume,
        training_record,
    )

    root = checkpoint_root(run_cfg, out_dir)
    checkpoint = CheckpointManager(root).newest(training_record(run_cfg))
    if checkpoint is None:
        checkpoint = resolve_resume(run_cfg, out_dir).path
    step = int(read_state(checkpoint)["step"]) if checkpoint else 0
    cause = _cause(exc)
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


#: What a finished run may have written into its directory, as the summary lists it.
OUTPUTS = (
    "metrics.jsonl",
    "summary.json",
    "reward_curve.png",
    "trace.json",
    "utilization.json",
    "checkpoints/",
    "rltrain.log",
)


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
    written = [name for name in OUTPUTS if os.path.exists(os.path.join(out_dir, name.rstrip("/")))]
    console.print(f"outputs: {out_dir} ({', '.join(written) or 'none'})")


def run(cfg: DictConfig) -> float | None:
    """Check the config and run the job it describes; in a Hydra job, what the terminal shows
    is also written to the run directory's ``rltrain.log``.

    Args:
        cfg: the composed Hydra config.

    Returns:
        The job's objective (for Hydra sweepers): its throughput, or None.

    Raises:
        ConfigError: when the config or the run's inputs fail a check; nothing has started yet.
        PlacementError / ResourceError: the placement cannot be laid out or does not fit.
    """
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return _run(cfg)
    from rltrain.telemetry.runlog import run_log

    out_dir = run_dir()
    os.makedirs(out_dir, exist_ok=True)
    with run_log(os.path.join(out_dir, _log_name())):
        return _run(cfg)


def _run(cfg: DictConfig) -> float | None:
    _refuse_private_preset()
    _apply_command_line(cfg)
    out_dir = run_dir()
    run_cfg = _checked(cfg, out_dir)
    claim_run_dir(out_dir, run_cfg)
    if run_cfg.task.generate and _language_model(run_cfg):
        from rltrain.tasks import prepare_task

        prepare_task(run_cfg)  # before the plan reads model.path's config.json
    from rltrain.runners.layout import decide_for_user, run_notes

    if run_cfg.placement.mode == "auto":  # rltrain chooses: profile, predict, rank
        from rltrain.autoplace import choose

        _stamp_run_dir(out_dir)

        choice = choose(run_cfg, out_dir)  # each candidate sizes its null micro-batches itself
        print(choice.text)
        if run_cfg.mode == "plan":
            return None
        run_cfg = choice.run  # the winner, a concrete layout; checked and run as any other
    # micro-batches left null: the largest that fits the layout (the auto winner's, not its base)
    unsized = run_cfg
    run_cfg, chosen = decide_for_user(run_cfg)
    for line in chosen:
        print(line)
    if run_cfg.mode == "plan":
        from rltrain.runners.plan_command import plan_command

        _stamp_run_dir(out_dir)
        plan = plan_command(run_cfg, out_dir, unsized=unsized)
        for note in run_notes(run_cfg, plan):
            print(note)
        return None
    from rltrain.runners.layout import preflight
    from rltrain.scheduler.interrupts import check_interrupt
    from rltrain.telemetry.summary import objective

    layout = preflight(run_cfg, out_dir)  # everything that can fail before Ray, at once
    check_interrupt()  # a Ctrl-C dropped during the checks: Ray is not started
    for note in layout.notes:
        log.warning(note)
    if layout.resume_note:
        log.info(layout.resume_note)
    for difference in layout.resume_differences:
        log.warning(difference)
    if run_cfg.trainer.resume == "auto":  # the runners resume from the checkpoint found here
        trainer = dataclasses.replace(run_cfg.trainer, resume=layout.resume)
        run_cfg = dataclasses.replace(run_cfg, trainer=trainer)
    startup.mark("preflight")
    _stamp_run_dir(out_dir)
    return objective(train(run_cfg, out_dir, layout))


def claim_run_dir(out_dir: str, run_cfg: RunConfig, key: str | None = None) -> None:
    """Refuse a run directory whose outputs the run would replace without a run having written
    them.

    A directory holding a file a run writes (``metrics.jsonl``, ``plan.json``...) without the
    stamp of an earlier run is the user's own (``hydra.run.dir=.``, a data directory): writing
    the run's outputs there would replace theirs. An earlier run's directory may be run into
    again, but a fresh training run (``trainer.resume=null``) would replace and prune the
    checkpoints it holds. A single Hydra run makes these checks before Hydra writes anything
    (:class:`RunDirCallback`), the rltrain launcher before a sweep's job starts; they are made
    again here for runs outside Hydra and jobs of other launchers.

    Args:
        out_dir: the run directory.
        run_cfg: the checked run config.
        key: the config key that chose ``out_dir``, for the message; None: the running Hydra
            job's (``hydra.run.dir``, or ``hydra.sweep.dir`` in a sweep).

    Raises:
        ConfigError: naming the directory's key, the files and the fix.
    """
    t = run_cfg.trainer
    _claim(out_dir, key or _run_dir_key(), run_cfg.mode, t.checkpoint_dir, t.resume)


def _claim(out_dir: str, key: str, mode: object, checkpoint_dir: object, resume: object) -> None:
    if os.path.exists(os.path.join(out_dir, RUN_STAMP)):
        _refuse_fresh_over_checkpoints(out_dir, key, mode, checkpoint_dir, resume)
        return
    held = [n for n in RUN_OUTPUTS if os.path.lexists(os.path.join(out_dir, n))]
    if held:
        raise ConfigError(
            f"{key}={out_dir!r} holds {', '.join(held)}, which no rltrain run wrote "
            f"there (no {RUN_STAMP} in it): the run would replace what is there. Point "
            f"{key} at a new directory (or leave it at its default, {_default_dir(key)})"
        )


def _default_dir(key: str) -> str:
    """Hydra's default for the run directory ``key`` names (a sweep's job: its number)."""
    if key.startswith("hydra.sweep.dir"):
        return "multirun/<date>/<time>, one <job number> directory per job"
    return "outputs/<date>/<time>"


def _refuse_fresh_over_checkpoints(
    out_dir: str, key: str, mode: object, checkpoint_dir: object, resume: object
) -> None:
    from rltrain.config.files import checkpoint_dir_contents

    own = os.path.join(out_dir, "checkpoints")
    if mode != "train" or checkpoint_dir or resume is not None:
        return
    if not os.path.isdir(own) or not (found := checkpoint_dir_contents(own)[1]):
        return
    raise ConfigError(
        f"{key}={out_dir!r} holds an earlier run's checkpoints ({', '.join(found[-3:])} "
        f"in checkpoints/) and trainer.resume=null starts afresh, which would replace and delete "
        f"them: set trainer.resume=auto to continue them, or point {key} at a new "
        f"directory"
    )


@dataclasses.dataclass(frozen=True)
class _Before:
    """What a single run's directory held before Hydra created or wrote into it."""

    existed: bool  # the directory (a refused run never removes it)
    names: frozenset[str]  # its entries (a refused run never removes them)
    first_new: str  # the outermost directory this run creates: the path itself or an ancestor
    cwd: str  # the working directory the run started in


#: Single runs' directories as they were before Hydra wrote into them, by absolute path.
_BEFORE: dict[str, _Before] = {}


def note_before_run(path: str) -> None:
    """Record what ``path`` holds before a run writes there, so that a refused run removes
    only what it created.

    Args:
        path: the run directory.
    """
    path = os.path.abspath(path)
    first_new = path
    while not os.path.lexists(os.path.dirname(first_new)):
        first_new = os.path.dirname(first_new)
    try:
        names, existed = frozenset(os.listdir(path)), True
    except FileNotFoundError:
        names, existed = frozenset(), False
    except OSError:  # not a directory, unreadable: Hydra's own mkdir reports it
        return
    _BEFORE[path] = _Before(existed, names, first_new, os.getcwd())


class RunDirCallback(Callback):
    """Hydra callback (``hydra.callbacks.run_dir`` in ``conf/config.yaml``): checks a single
    run's directory before Hydra creates it or writes ``.hydra/`` into it.

    Hydra writes ``.hydra/`` before the task function starts, and a callback cannot stop a
    run (Hydra turns what it raises into a warning). So when :func:`claim_run_dir` would refuse
    the directory, Hydra is told not to write ``.hydra/`` (``hydra.output_subdir=null``) and
    the task function refuses the run with the same check. The callback also records what the
    directory held, for :func:`refused_run`.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Record what the run directory holds; keep Hydra out of one the run will refuse.

        Args:
            config: the composed config, ``hydra`` node included.
            kwargs: what else Hydra passes (unused).
        """
        from omegaconf import OmegaConf, read_write

        try:
            path = os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir")))
            note_before_run(path)
            mode = OmegaConf.select(config, "mode")
            checkpoint_dir = OmegaConf.select(config, "trainer.checkpoint_dir")
            resume = OmegaConf.select(config, "trainer.resume")
        except Exception:  # noqa: BLE001 - the task's own checks name what does not resolve
            return
        try:
            _claim(path, "hydra.run.dir", mode, checkpoint_dir, resume)
        except ConfigError:
            with read_write(config.hydra):
                config.hydra.output_subdir = None


def _stamp_run_dir(out_dir: str) -> None:
    """Mark ``out_dir`` as a run's, just before the run writes its outputs there."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, RUN_STAMP), "w") as f:
        f.write("this directory holds an rltrain run's outputs\n")


def _run_dir_key() -> str:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return "the run directory (the working directory)"
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return "hydra.sweep.dir (with hydra.sweep.subdir)"
    return "hydra.run.dir"


def _checked(cfg: DictConfig, out_dir: str | None) -> RunConfig:
    """The config checked; when it fails, the problems preflight finds are reported with its
    own (as far as a config with problems can be laid out), so one run lists everything.

    Raises:
        ConfigError: every problem found.
    """
    from rltrain.config.validate import check_config

    run_cfg, problems = check_config(cfg)
    if not problems:
        return run_cfg
    raise ConfigError(problems + _layout_problems(run_cfg, out_dir, problems))


def _layout_problems(run_cfg: RunConfig, out_dir: str | None, known: list[str]) -> list[str]:
    """Preflight's problems of a config that already failed its checks, new ones only (a
    problem the checks stated already, worded with another fix, is left out).

    Nothing is written: a task that generates its data is left out (its checks would write
    it first), and the checks run as a plan's. A ``placement=auto`` run is left out too: its
    config's layout is only the first one profiled, and each layout is checked when chosen.
    """
    from rltrain.runners.layout import preflight

    if run_cfg.task.generate or run_cfg.placement.mode == "auto":
        return []
    found: list[str] = []
    try:
        preflight(dataclasses.replace(run_cfg, mode="plan"), out_dir)
    except ConfigError as exc:
        found = list(exc.problems)
    except RltrainError as exc:
        found = [str(exc)]
    except Exception:  # noqa: BLE001 - a config with problems may not lay out at all
        return []
    # The config checks and preflight's loaders word a fix differently (task.path's
    # "does not exist: give ..."): one problem, reported once, by what precedes the fix.
    stated = {_statement(p) for p in known}
    return [p for p in found if _statement(p) not in stated]


def _statement(problem: str) -> str:
    """What a problem message says is wrong: the text before its first ``": "`` (the fix)
    when that says more than ``key=value`` (else two problems of one key would merge); else
    the whole message."""
    statement, _, fix = problem.partition(": ")
    return statement if fix and " " in statement.split("=", 1)[-1] else problem


def _apply_command_line(cfg: DictConfig) -> None:
    """What the command line means beyond Hydra's merge (``placement.offload={}`` empties the
    shipped policies: :mod:`rltrain.config.overrides`)."""
    from hydra.core.hydra_config import HydraConfig

    from rltrain.config.overrides import apply_empty_mappings

    if HydraConfig.initialized():
        apply_empty_mappings(cfg, HydraConfig.get().overrides.task)


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

    The refusal goes into the run's log (``<hydra.job.name>.log``: ``rltrain.log``). What this
    run created in its run directory before the job started (:func:`hydra_files`) is removed
    when the directory holds nothing else, and so is the directory when this run created it
    (with the empty parents it created), so a refused command leaves nothing behind. Nothing
    that was there before the run is removed: what was there is known from
    :class:`RunDirCallback` (``hydra.callbacks.run_dir``), and without its record nothing is
    removed.

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
        # Hydra names run directories to the second: another refused run started in the same
        # second may have removed this one already (then there is nothing to log into)
        with (
            contextlib.suppress(FileNotFoundError),
            open(os.path.join(path, _log_name()), "a") as f,
        ):  # the terminal shows it once
            f.write(f"rltrain: refused: {exc}\n")
    return True


def _remove_if_untouched(path: str) -> bool:
    """Remove what this run created in its run directory when that is only Hydra's files.

    Only what :func:`note_before_run` shows this run created is removed: the directory (and
    the empty parents it created) when it is new, else the Hydra files that were not there.

    Returns:
        Whether no log of this run is left there to record the refusal in.
    """
    path = os.path.abspath(path)
    before = _BEFORE.get(path)
    try:
        names = set(os.listdir(path))
    except FileNotFoundError:
        return True  # removed by a refused run of the same second
    except OSError:
        return False
    if before is None:
        return False  # what was there before this run is unknown: nothing is removed
    created = names - before.names
    if not created <= hydra_files():
        return False  # the run wrote outputs (a refused plan keeps its drawing and log)
    if before.existed:
        for name in created:
            target = os.path.join(path, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.remove(target)
        return _log_name() not in before.names  # a log that was there gets the refusal
    with contextlib.suppress(OSError):  # hydra.job.chdir=true: the job runs inside it
        if os.path.commonpath([os.getcwd(), path]) == path:
            os.chdir(before.cwd)
    shutil.rmtree(path, ignore_errors=True)
    parent = os.path.dirname(path)
    while path != before.first_new and parent != os.path.dirname(parent):
        try:
            os.rmdir(parent)  # only when empty
        except OSError:
            break
        path, parent = parent, os.path.dirname(parent)
    return True


#: Overrides a second look leaves alone: Hydra's own settings and launcher flags.
_NOT_CHECKED = ("hydra.", "hydra/", "+hydra", "~hydra")


def problems_beside(overrides: list[str], config_path: str, failed: BaseException) -> list[str]:
    """The other problems of a command line whose override Hydra refused while composing.

    Hydra stops at the first override it cannot merge (a value of the wrong type, a key that
    needs ``+``); the config checks never see the rest. Here the refused overrides are left
    out one by one, the remainder is composed again with the command's own primary config
    (``--config-name``, ``--config-path``, ``--config-dir``), and every check that runs before
    Ray (the config checks, then the layout's) reports on it, so one command lists everything.
    Nothing is written and nothing starts.

    Args:
        overrides: the command line: its overrides and Hydra's flags.
        config_path: the primary config's location (``rltrain.__main__.CONFIG_PATH``), unless
            the command line names another with ``--config-path``.
        failed: what Hydra raised for the command line.

    Returns:
        The further problems (each naming key, value and fix), not repeating the first.
    """
    from rltrain.config.errors import explain

    source = _ConfigSource.of(overrides, config_path)
    if source is None:
        return []
    rest = [o for o in source.overrides if not o.startswith(_NOT_CHECKED)]
    found: list[str] = []
    exc: BaseException | None = failed
    for _ in range(len(rest) + 1):
        bad = _refused_override(rest, exc) if exc is not None else None
        if bad is None:
            break
        rest.remove(bad)
        try:
            cfg = source.compose(rest)
        except Exception as again:  # noqa: BLE001 - the next refused override, explained below
            message = explain(again)
            if message is None:
                return found
            found.append(message)
            exc = again
            continue
        return found + _checks_of(cfg)
    return found


def _refused_override(overrides: list[str], exc: BaseException) -> str | None:
    """The override a composition error names (None when it names none of them)."""
    text = str(exc)
    named = [o for o in overrides if f"override {o}" in text or f"'{_key(o)}'" in text]
    return named[0] if len(named) == 1 else None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


@dataclasses.dataclass(frozen=True)
class _ConfigSource:
    """Where a command line's config comes from, as Hydra's own flags set it.

    Attributes:
        primary: the primary config's directory (a path or ``pkg://`` module).
        config_name: the primary config's name (``--config-name``; ``config`` by default).
        config_dir: the directory ``--config-dir`` adds ahead of the others, or None.
        overrides: the command line's overrides (what is not a flag or a flag's value).
        searchpath: its ``hydra.searchpath`` override (which changes where configs are found),
            kept when Hydra's other settings are left out.
    """

    primary: str
    config_name: str
    config_dir: str | None
    overrides: tuple[str, ...]
    searchpath: tuple[str, ...] = ()

    @classmethod
    def of(cls, argv: list[str], config_path: str) -> _ConfigSource | None:
        """Read Hydra's flags off ``argv`` (None when Hydra's parser refuses it)."""
        from hydra._internal.utils import compute_search_path_dir, get_args_parser

        try:
            args = get_args_parser().parse_args(argv)
        except SystemExit:  # argparse's way to refuse: the first problem is reported already
            return None
        primary = config_path
        if args.config_path is not None:  # relative: to rltrain/__main__.py, as Hydra has it
            main_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")
            primary = compute_search_path_dir(main_file, None, args.config_path) or config_path
        overrides = tuple(args.overrides or ())
        return cls(
            primary=primary,
            config_name=args.config_name or "config",
            config_dir=os.path.abspath(args.config_dir) if args.config_dir else None,
            overrides=overrides,
            searchpath=tuple(o for o in overrides if _key(o) == "hydra.searchpath"),
        )

    def compose(self, overrides: list[str]) -> DictConfig:
        """Compose ``overrides`` the way the command line's run does (its search path and
        primary config), without Hydra's own node."""
        from hydra._internal.hydra import Hydra
        from hydra._internal.utils import create_config_search_path
        from hydra.core.config_search_path import SearchPathQuery
        from hydra.core.global_hydra import GlobalHydra
        from hydra.types import RunMode
        from omegaconf import open_dict

        search_path = create_config_search_path(self.primary)
        if self.config_dir is not None:  # where Hydra's run puts it: before the schemas
            search_path.prepend(
                provider="command-line",
                path=f"file://{self.config_dir}",
                anchor=SearchPathQuery(provider="schema"),
            )
        GlobalHydra.instance().clear()
        try:
            hydra = Hydra.create_main_hydra2(task_name="rltrain", config_search_path=search_path)
            cfg = hydra.compose_config(
                config_name=self.config_name,
                overrides=[*self.searchpath, *overrides],
                run_mode=RunMode.RUN,
                from_shell=False,
                with_log_configuration=False,
            )
        finally:
            GlobalHydra.instance().clear()
        with open_dict(cfg):
            cfg.pop("hydra", None)
        return cfg


def _checks_of(cfg: DictConfig) -> list[str]:
    """Problems of a composed config: the config checks, then (when they pass and the task
    writes nothing) everything preflight finds, as a plan would."""
    from rltrain.runners.layout import preflight

    cfg.mode = "plan"  # the checks of a plan write nothing
    try:
        run_cfg = _checked(cfg, None)
        if run_cfg.task.generate:
            return []  # its checks would write the generated data first
        preflight(run_cfg, None)
    except ConfigError as exc:
        return list(exc.problems)
    except RltrainError as exc:
        return [str(exc)]
    return []
