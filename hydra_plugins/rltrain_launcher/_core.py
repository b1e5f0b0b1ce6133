"""The sweep: compose and plan every job, then run them on one Ray cluster, then report.

Order of events in :func:`launch`:

1. Compose every job's config (a composition error, or jobs given one output directory by
   ``hydra.sweep.subdir``, stops the sweep before anything runs) and plan it: which devices it
   needs, or why it can never run (that job alone fails, at once).
2. Check that the jobs share one ``cluster`` config; start or join that Ray cluster.
3. Admit jobs in order while they fit: at most ``max_concurrent_jobs`` at once, each on a slice
   of free devices disjoint from the others' (:mod:`._slices`). Each job runs in a fresh driver
   process (:mod:`._driver`) on this node, which reserves nothing itself.
4. When a job's driver exits, wait for Ray to free what the job held, release its slice, and
   admit the next jobs. A failed job never stops the others of the batch (a sweeper decides
   whether its next batches run).
5. Write the report (:mod:`._report`) and return one ``JobReturn`` per job, in order.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import pickle
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import (
    JobReturn,
    JobStatus,
    configure_log,
    env_override,
    filter_overrides,
    setup_globals,
)
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydra_plugins.rltrain_launcher import _ray, _report
from hydra_plugins.rltrain_launcher._plan import JobNeeds, job_needs
from hydra_plugins.rltrain_launcher._slices import DeviceSlice, SliceAllocator
from hydra_plugins.rltrain_launcher.rltrain_launcher import RltrainLauncher, RltrainLauncherConf
from rltrain.errors import ConfigError, ResourceError, RltrainError, WorkerError
from rltrain.scheduler.discovery import SLICE_ENV

#: Marks a directory a sweep has written its report into (a later batch may replace it).
SWEEP_STAMP = ".rltrain_sweep"

log = logging.getLogger(__name__)

#: Environment variables a job's driver receives (documented in docs/launcher.md); the job's
#: cluster discovery reads the slice.
ENV_SLICE = SLICE_ENV
ENV_JOB = "RLTRAIN_SWEEP_JOB"
ENV_SWEEP_DIR = "RLTRAIN_SWEEP_DIR"


@dataclass
class Job:
    """One job of the batch, composed and planned."""

    num: int
    overrides: list[str]
    sweep_config: DictConfig
    needs: JobNeeds
    output_dir: str
    slice: DeviceSlice | None = None
    process: subprocess.Popen[bytes] | None = None
    start: float | None = None
    end: float | None = None
    ret: JobReturn | None = None
    error: str = ""
    # The job directory's summary.json before the job started (an earlier run's), if any.
    summary_before: tuple[int, int] | None = None
    # The outermost directory composing made to check the job in (hydra.job.chdir=true).
    made_dir: str | None = None


# ------------------------------------------------------------------------------------ compose
def _compose(launcher: RltrainLauncher, overrides: Sequence[str], num: int) -> Job:
    """Compose one job's config, resolved, with its output directory fixed, and plan it.

    Everything is resolved here because a job's driver cannot evaluate resolvers registered
    only in this process (``${hydra:...}``, a user's custom resolvers). It is resolved, and
    planned, as the job's driver will see it: with ``hydra.job.env_set`` in the environment
    (``${oc.env:...}``), and with ``hydra.job.chdir=true`` in the job's directory (relative
    paths), :func:`_as_the_job`.
    """
    assert launcher.hydra_context is not None and launcher.config is not None  # set by setup()
    cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(cfg):
        cfg.hydra.job.id = f"{num}"
        cfg.hydra.job.num = num
    saved = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        sweep = cfg.hydra.sweep
        output_dir = os.path.abspath(os.path.join(str(sweep.dir), str(sweep.subdir)))
        with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
            cfg.hydra.runtime.output_dir = output_dir
        HydraConfig.instance().set_config(cfg)
        try:
            env = _env_set(cfg)
            # HydraConfig.set_config marks the hydra node read-only.
            with read_write(cfg), read_write(cfg.hydra), env_override(env):
                OmegaConf.resolve(cfg)
        except Exception as exc:  # noqa: BLE001 - an unresolvable config fails its job alone
            return Job(num, list(overrides), cfg, JobNeeds(error=exc), output_dir)
    finally:
        HydraConfig.instance().cfg = saved
    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    chdir = bool(OmegaConf.select(cfg, "hydra.job.chdir", default=False))
    made = _first_missing(output_dir) if chdir else None
    with _as_the_job(env, output_dir if chdir else None) as refused:
        needs = job_needs(
            task_cfg,
            output_dir,
            config_loader=launcher.hydra_context.config_loader,
            config_name=launcher.config.hydra.job.config_name,
            overrides=overrides,
        )
        refused.append(needs.error is not None)
    made = None if any(refused) else made  # a refused job's directories are gone already
    return Job(num, list(overrides), cfg, needs, output_dir, made_dir=made)


def _env_set(cfg: DictConfig) -> dict[str, str]:
    """``hydra.job.env_set``, resolved: what Hydra's ``run_job`` puts in the job's environment."""
    env = OmegaConf.select(cfg, "hydra.job.env_set", default=None)
    if not env:
        return {}
    return {str(k): str(v) for k, v in OmegaConf.to_container(env, resolve=True).items()}


@contextlib.contextmanager
def _as_the_job(env: Mapping[str, str], job_dir: str | None) -> Iterator[list[bool]]:
    """Check a job where its driver will run it: with ``env`` in the environment and, given
    ``job_dir`` (``hydra.job.chdir=true``), in that directory, which Hydra's ``run_job``
    creates and enters before the task starts. The launcher's environment and working directory
    are restored after.

    Yields:
        A list the caller appends True to when the job is refused: then the directories made
        here are removed again when still empty, as a refused single run leaves none behind.
    """
    refused: list[bool] = []
    cwd = os.getcwd()
    first_new = None
    if job_dir is not None:
        first_new = _first_missing(job_dir)
        os.makedirs(job_dir, exist_ok=True)
        os.chdir(job_dir)
    try:
        with env_override(dict(env)):
            yield refused
    except BaseException:
        refused.append(True)  # the check itself raised: the sweep stops, the job never runs
        raise
    finally:
        os.chdir(cwd)
        if job_dir is not None and first_new is not None and any(refused):
            _remove_empty(job_dir, first_new)


def _first_missing(path: str) -> str | None:
    """The outermost directory of ``path`` that does not exist yet; None when it exists."""
    first = path
    while not os.path.lexists(os.path.dirname(first)):
        first = os.path.dirname(first)
    return None if os.path.lexists(first) else first


def _unmake_job_dirs(jobs: Sequence[Job]) -> None:
    """Remove the directories composing made for the jobs' checks, while still empty: the sweep
    stopped before any job ran (later jobs first, as an earlier job's may hold theirs)."""
    for job in reversed(jobs):
        if job.made_dir is not None:
            _remove_empty(job.output_dir, job.made_dir)


def _remove_empty(path: str, top: str) -> None:
    """Remove ``path`` and its parents up to ``top`` while they are empty."""
    while True:
        try:
            os.rmdir(path)
        except OSError:
            return
        if path == top:
            return
        path = os.path.dirname(path)


def _flatten(node: Any, prefix: str) -> dict[str, Any]:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}"))
        return out
    return {prefix: node}


def one_cluster(jobs: Sequence[Job]) -> Mapping[str, Any] | None:
    """The ``cluster`` section every rltrain job of the sweep shares (None for other apps).

    Raises:
        ConfigError: when jobs differ in any ``cluster.*`` key, naming the keys and values.
    """
    clusters = [(j.num, j.needs.cluster) for j in jobs if j.needs.cluster is not None]
    if not clusters:
        return None
    first_num, first = clusters[0]
    flat0 = _flatten(first, "cluster")
    problems = []
    for num, other in clusters[1:]:
        flat = _flatten(other, "cluster")
        for key in sorted(set(flat0) | set(flat)):
            if flat0.get(key) != flat.get(key):
                problems.append(
                    f"{key} is {flat0.get(key)!r} in job #{first_num} but {flat.get(key)!r} in "
                    f"job #{num}"
                )
    if problems:
        raise ConfigError(
            [
                *problems,
                "hydra/launcher=rltrain runs a sweep on one cluster, so jobs cannot differ in "
                "cluster.*: run one sweep per cluster (e.g. `-m cluster.devices_per_node=4 "
                "placement=...`), or use hydra/launcher=basic to run each job on its own cluster",
            ]
        )
    return first


# --------------------------------------------------------------------------------- job returns
def _failed(job: Job, exc: Exception) -> JobReturn:
    """A JobReturn for a job whose driver never returned one (refused, crashed, killed)."""
    cfg = copy.deepcopy(job.sweep_config)
    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    ret = JobReturn(
        overrides=list(job.overrides),
        cfg=task_cfg,
        hydra_cfg=cfg,
        working_dir=job.output_dir,
        task_name=str(OmegaConf.select(cfg, "hydra.job.name", default="")) or None,
        status=JobStatus.FAILED,
    )
    ret.return_value = exc
    return ret


def error_cell(exc: BaseException) -> str:
    """The report's one-line error of a failed job: every problem of a refusal, joined with
    ``"; "``; the first line of anything else (a crash's traceback stays in the job's log).

    Args:
        exc: why the job failed.

    Returns:
        ``"<type>: <text>"`` on one line.
    """
    problems = getattr(exc, "problems", None)
    if isinstance(exc, ConfigError) and isinstance(problems, list) and problems:
        text = "; ".join(" ".join(str(p).split()) for p in problems)
    else:
        text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _failure_lines(job: Job) -> str:
    """A failed job's entry in the log's list of failures: the whole message of a refusal
    (every problem), the report's line of a crash (its traceback is in the job's log above)."""
    assert job.ret is not None  # an ended job
    exc = job.ret._return_value
    refusal = isinstance(exc, RltrainError) and not isinstance(exc, WorkerError)
    text = _message(exc).replace("\n", "\n    ") if refusal else job.error
    return f"  #{job.num} {' '.join(job.overrides)}: {text}"


def _message(exc: BaseException) -> str:
    """The whole message of a refusal (every problem), the type name of anything else."""
    return str(exc) if isinstance(exc, RltrainError) else f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------- drivers
class _Drivers:
    """Starts job drivers and reports their exits on one queue (no polling)."""

    def __init__(
        self,
        launcher: RltrainLauncher,
        session: _ray.RaySession | None,
        tmp: str,
        runtime_env: Mapping[str, Any],
    ) -> None:
        self.launcher = launcher
        self.session = session
        self.tmp = tmp
        self.exits: queue.Queue[tuple[int, int, bool, float]] = queue.Queue()
        self.runtime_env = dict(runtime_env)

    def _spec(self, job: Job) -> str:
        import cloudpickle

        assert self.launcher.hydra_context is not None  # set by setup()
        payload = cloudpickle.dumps(
            {
                "hydra_context": self.launcher.hydra_context,
                "sweep_config": job.sweep_config,
                "task_function": self.launcher.task_function,
                "singleton_state": Singleton.get_state(),
            }
        )
        header = {
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "ray_address": self.session.address if job.needs.uses_ray and self.session else None,
            "namespace": f"rltrain-sweep-{os.getpid()}-job{job.num}",
            "runtime_env": self.runtime_env,
        }
        path = os.path.join(self.tmp, f"job{job.num}.spec")
        with open(path, "wb") as f:
            pickle.dump((header, payload), f)
        return path

    def start(self, job: Job) -> None:
        """Start the job's driver process; its exit is posted to :attr:`exits`."""
        spec = self._spec(job)
        result = os.path.join(self.tmp, f"job{job.num}.result")
        env = dict(os.environ)
        if self.session is not None:
            env["RAY_ADDRESS"] = self.session.address
        env.update(
            {
                ENV_SLICE: (job.slice or DeviceSlice()).to_json(),
                ENV_JOB: str(job.num),
                ENV_SWEEP_DIR: os.path.abspath(str(job.sweep_config.hydra.sweep.dir)),
            }
        )
        cmd = [sys.executable, "-m", "hydra_plugins.rltrain_launcher._driver", spec, result]
        job.start = time.time()
        job.process = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
        threading.Thread(target=self._watch, args=(job,), daemon=True).start()

    def _watch(self, job: Job) -> None:
        assert job.process is not None  # started by start()
        timed_out = False
        try:
            rc = job.process.wait(timeout=self.launcher.job_timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            job.process.kill()
            rc = job.process.wait()
        self.exits.put((job.num, rc, timed_out, time.time()))

    def collect(self, job: Job, rc: int, timed_out: bool) -> JobReturn:
        """The job's JobReturn: the one its driver wrote, or a failure saying why there is none."""
        import cloudpickle

        result = os.path.join(self.tmp, f"job{job.num}.result")
        if os.path.exists(result):
            with open(result, "rb") as f:
                return cloudpickle.load(f)
        if timed_out:
            why = f"was killed after hydra.launcher.job_timeout_s={self.launcher.job_timeout_s}"
        else:
            why = f"exited with code {rc} before returning a result"
        exc = WorkerError(
            f"job #{job.num} ({' '.join(job.overrides) or 'no overrides'}) {why}; its output is "
            f"above and in {job.output_dir}"
        )
        return _failed(job, exc)

    def kill_all(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            if job.process is not None and job.process.poll() is None:
                job.process.kill()


# ------------------------------------------------------------------------------------ schedule
def _refuse_impossible(jobs: Sequence[Job], allocator: SliceAllocator) -> None:
    """Fail, before anything runs, each job that can never run; say why at once."""
    for job in jobs:
        exc = job.needs.error
        if exc is None:
            reason = allocator.never_fits(job.needs.devices)
            exc = ResourceError(f"job #{job.num}: {reason}") if reason else None
        if exc is not None:
            job.ret = _failed(job, exc)
            job.error = error_cell(exc)
            log.error("rltrain launcher: job #%s cannot run: %s", job.num, _message(exc))


def _refuse_shared_checkpoint_dirs(jobs: Sequence[Job]) -> None:
    """Fail, before anything runs, jobs that would write one ``trainer.checkpoint_dir``: each
    would replace and prune the others' checkpoints."""
    sharing: dict[str, list[tuple[Job, str]]] = {}
    for job in jobs:
        if job.ret is None:
            where = OmegaConf.select(job.sweep_config, "trainer.checkpoint_dir", default=None)
            if where:
                sharing.setdefault(_checkpoint_place(job, str(where)), []).append((job, str(where)))
    for place, group in sharing.items():
        if len(group) < 2:
            continue
        nums = ", ".join(f"#{j.num}" for j, _ in group)
        for job, where in group:
            shown = repr(where) if where == place else f"{where!r} ({place})"
            exc = ConfigError(
                f"trainer.checkpoint_dir={shown} is the checkpoint directory of jobs {nums}: "
                f"each would replace and delete the others' checkpoints. Leave it null (each "
                f"job writes <job dir>/checkpoints) or give each job its own, e.g. "
                f"'trainer.checkpoint_dir=${{hydra:runtime.output_dir}}/checkpoints'"
            )
            job.ret = _failed(job, exc)
            job.error = error_cell(exc)
            log.error("rltrain launcher: job #%s cannot run: %s", job.num, _message(exc))


def _checkpoint_place(job: Job, where: str) -> str:
    """Where a job's ``trainer.checkpoint_dir`` lies: an absolute, normalised path (relative
    ones from the job's working directory), or a URI as written."""
    if "://" in where:
        return where.rstrip("/")
    chdir = OmegaConf.select(job.sweep_config, "hydra.job.chdir", default=False)
    base = job.output_dir if chdir else os.getcwd()
    return os.path.realpath(os.path.join(base, os.path.expanduser(where)))


def refuse_shared_job_dirs(jobs: Sequence[Job], earlier: Mapping[str, int]) -> None:
    """Refuse jobs whose output directories are one (``hydra.sweep.subdir`` names no job's own
    directory): each would replace the others' outputs and checkpoints.

    Args:
        jobs: the batch's jobs.
        earlier: output directory -> job number, of the sweep's earlier batches.

    Raises:
        ConfigError: naming the jobs, the directory and ``hydra.sweep.subdir``; nothing has run.
    """
    owners: dict[str, list[int]] = {}
    for where, num in earlier.items():
        owners.setdefault(where, []).append(num)
    for job in jobs:
        owners.setdefault(job.output_dir, []).append(job.num)
    problems = [
        f"jobs {', '.join(f'#{n}' for n in nums)} would all write into {where!r}"
        for where, nums in owners.items()
        if len(nums) > 1
    ]
    if problems:
        subdir = OmegaConf.select(jobs[0].sweep_config, "hydra.sweep.subdir", default=None)
        raise ConfigError(
            [
                *problems,
                f"hydra.sweep.subdir={subdir!r} gives these jobs one directory: each would "
                f"replace the others' outputs and checkpoints. Make it differ per job, e.g. "
                f"hydra.sweep.subdir='${{hydra.job.num}}' (the default)",
            ]
        )


def _claim_sweep_dir(sweep_dir: Path) -> None:
    """Refuse a sweep directory holding report files no sweep wrote; else stamp it.

    Raises:
        ConfigError: naming ``hydra.sweep.dir``, the files and the fix.
    """
    stamp = sweep_dir / SWEEP_STAMP
    if stamp.exists():
        return
    names = (_report.CSV_FILE, _report.MD_FILE, _report.PNG_FILE)
    held = [n for n in names if os.path.lexists(sweep_dir / n)]
    if held:
        raise ConfigError(
            f"hydra.sweep.dir={str(sweep_dir)!r} holds {', '.join(held)}, which no rltrain sweep "
            f"wrote (no {SWEEP_STAMP} in it): the sweep report would replace what is there. Point "
            f"hydra.sweep.dir at a new directory (or leave it at its default, "
            f"multirun/<date>/<time>)"
        )
    sweep_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text("this directory holds an rltrain sweep's report\n")


def _run_all(launcher: RltrainLauncher, jobs: Sequence[Job], drivers: _Drivers, allocator) -> None:
    """Admit jobs in order as devices free up; return when every job has ended."""
    pending = [j for j in jobs if j.ret is None]
    running: dict[int, Job] = {}
    try:
        while pending or running:
            for job in list(pending):
                if len(running) >= launcher.max_concurrent_jobs:
                    break
                piece = allocator.allocate(job.needs.devices)
                if piece is None:
                    continue  # waits for a running job to free devices; later jobs may fit now
                job.slice = piece
                job.summary_before = _summary_stamp(job.output_dir)
                pending.remove(job)
                running[job.num] = job
                log.info(
                    "rltrain launcher: #%s %s%s",
                    job.num,
                    " ".join(filter_overrides(job.overrides)),
                    f"  [devices {piece.describe()}]" if piece.mapping else "",
                )
                drivers.start(job)
            if not running:  # cannot happen after _refuse_impossible; never block for ever
                raise ResourceError(f"jobs {[j.num for j in pending]} fit on no free devices")
            num, rc, timed_out, end = drivers.exits.get()
            job = running.pop(num)
            job.end = end
            job.ret = drivers.collect(job, rc, timed_out)
            if job.ret.status == JobStatus.FAILED:
                job.error = error_cell(job.ret._return_value)
            _release(launcher, drivers.session, job, running.values())
            allocator.release(job.slice or DeviceSlice())
    except BaseException:
        drivers.kill_all(list(running.values()))
        raise


def _release(
    launcher: RltrainLauncher, session: _ray.RaySession | None, job: Job, others: Any
) -> None:
    """Wait until Ray has freed what the ended job held (its actors and placement groups):
    until the nodes of its slice have as many GPUs free as when the sweep started, less what
    the running jobs hold there (GPUs of other Ray jobs, or of nodes the sweep does not use,
    are not waited for)."""
    if not job.needs.uses_ray or session is None or job.slice is None:
        return
    running = [d for o in others if o.slice is not None for d in o.slice.devices]
    expected = _ray.expected_free(session.free_gpus, job.slice.devices, running)
    by_id = {session.node_ids[n]: v for n, v in expected.items() if n in session.node_ids}
    if not by_id:
        return
    if not _ray.wait_devices_free(by_id, launcher.release_timeout_s):
        log.warning(
            "rltrain launcher: Ray has not freed job #%s's devices after %ss (or another Ray "
            "job took them meanwhile); admitting the next job anyway (its placement group will "
            "wait for them)",
            job.num,
            launcher.release_timeout_s,
        )


# -------------------------------------------------------------------------------------- report
def _summary_stamp(output_dir: str) -> tuple[int, int] | None:
    """The identity of the ``summary.json`` in a job directory now (None: there is none)."""
    from rltrain.telemetry.summary import SUMMARY_FILE

    try:
        st = os.stat(os.path.join(output_dir, SUMMARY_FILE))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def job_summary(job: Job) -> dict[str, Any] | None:
    """The summary the job wrote; None when it wrote none (a plan, a refusal, a driver killed
    before it wrote one), even where its directory keeps an earlier run's ``summary.json``. A
    run that failed or was interrupted writes one (``status`` failed or interrupted).

    Args:
        job: an ended job.

    Returns:
        The job's summary (:func:`rltrain.telemetry.summary.read_job_summary`) or None.
    """
    from rltrain.telemetry.summary import read_job_summary

    if job.start is None:
        return None  # refused before its driver started: nothing there is this job's
    now = _summary_stamp(job.output_dir)
    if now is None or now == job.summary_before:
        return None
    return read_job_summary(job.output_dir)


def in_cluster_numbering(
    summary: Mapping[str, Any] | None, piece: DeviceSlice | None
) -> Mapping[str, Any] | None:
    """A job's summary with its per-device peak memory keyed as the report's devices column
    is: ``"<node>:<device>"`` of the sweep's cluster, not of the job's own plan (a job moved to
    other devices numbers them from 0 itself).

    Args:
        summary: the job's summary, or None.
        piece: the devices the job ran on; None or empty: the job's numbering is kept.

    Returns:
        The summary, with ``peak_memory_bytes_per_device`` renamed where the slice maps it.
    """
    if not summary or piece is None or not piece.mapping:
        return summary
    to_cluster = {f"{n}:{d}": f"{cn}:{cd}" for (n, d), (cn, cd) in piece.mapping}
    memory = summary.get("peak_memory_bytes_per_device")
    if not isinstance(memory, Mapping):
        return summary
    renamed = {to_cluster.get(str(dev), str(dev)): peak for dev, peak in memory.items()}
    return {**summary, "peak_memory_bytes_per_device": renamed}


def _report_jobs(launcher: RltrainLauncher, jobs: Sequence[Job], sweep_dir: Path) -> None:
    rows = {r["job"]: r for r in launcher.report_rows}
    for job in jobs:
        if job.ret is None:  # the sweep was interrupted before the job ended
            status = "interrupted"
        else:
            status = "completed" if job.ret.status == JobStatus.COMPLETED else "failed"
        objective = job.ret._return_value if job.ret and status == "completed" else None
        info = {
            "num": job.num,
            "overrides": job.overrides,
            "status": status,
            "error": job.error,
            "start": job.start,
            "end": job.end,
            "slice": job.slice.describe() if job.slice else "",
            "output_dir": job.output_dir,
            "objective": objective if isinstance(objective, int | float) else None,
            "placement_mode": job.needs.placement_mode,
        }
        rows[job.num] = _report.make_row(info, in_cluster_numbering(job_summary(job), job.slice))
    launcher.report_rows = [rows[k] for k in sorted(rows)]
    out = _report.write_report(launcher.report_rows, str(sweep_dir))
    print(f"\nSweep report ({out['md']}):\n\n{out['table']}", flush=True)


def _report_interrupted(launcher: RltrainLauncher, jobs: Sequence[Job], sweep_dir: Path) -> None:
    """The report of a sweep stopped by Ctrl-C or a launcher failure, never hiding why it
    stopped: a report that cannot be written is only logged."""
    try:
        _report_jobs(launcher, jobs, sweep_dir)
    except Exception as exc:  # noqa: BLE001 - the interrupt (exit code 130) must propagate
        log.error("rltrain launcher: could not write the interrupted sweep's report: %s", exc)


# -------------------------------------------------------------------------------------- launch
def _check_options(launcher: RltrainLauncher) -> None:
    problems = []
    if launcher.max_concurrent_jobs < 1:
        problems.append(
            f"hydra.launcher.max_concurrent_jobs={launcher.max_concurrent_jobs} must be >= 1"
        )
    if launcher.job_timeout_s is not None and not launcher.job_timeout_s > 0:
        problems.append(
            f"hydra.launcher.job_timeout_s={launcher.job_timeout_s} must be > 0 (seconds before "
            f"a job's driver is killed), or null for no limit"
        )
    if not launcher.release_timeout_s > 0:
        problems.append(
            f"hydra.launcher.release_timeout_s={launcher.release_timeout_s} must be > 0 (seconds "
            f"to wait for Ray to free a finished job's devices; the default is 60)"
        )
    known = ", ".join(f.name for f in fields(RltrainLauncherConf) if not f.name.startswith("_"))
    for key in launcher.unknown:
        problems.append(
            f"hydra.launcher.{key} is not an option of hydra/launcher=rltrain (known: {known}): "
            f"remove +hydra.launcher.{key}"
        )
    remote = launcher.ray_cfg.get("remote") or {}
    for key in remote:
        if key != "runtime_env":
            problems.append(
                f"hydra.launcher.ray.remote.{key} is not used by hydra/launcher=rltrain: a job's "
                "driver reserves nothing, its devices come from its placement plan; remove it "
                "(only ray.remote.runtime_env applies), or use hydra/launcher=ray"
            )
    if problems:
        raise ConfigError(problems)


def _remote_runtime_env(launcher: RltrainLauncher) -> dict[str, Any]:
    """``hydra.launcher.ray.remote.runtime_env``, plain (empty when unset)."""
    remote = launcher.ray_cfg.get("remote") or {}
    env = remote["runtime_env"] if "runtime_env" in remote else None
    if isinstance(env, DictConfig):
        return dict(OmegaConf.to_container(env, resolve=True))  # type: ignore[arg-type]
    return dict(env or {})


def launch(
    launcher: RltrainLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[JobReturn]:
    """Run a batch of jobs (see the module docstring for the order of events).

    Args:
        launcher: the configured launcher (after ``setup``).
        job_overrides: each job's overrides.
        initial_job_idx: the first job's number in the whole sweep.

    Returns:
        One JobReturn per job, in the order of ``job_overrides``.

    Raises:
        ConfigError: for a bad launcher option, a job config that does not compose, jobs that
            share an output directory or differ in ``cluster.*``. Nothing has run then, and the
            job directories made to check the jobs in (``hydra.job.chdir=true``) are removed
            while still empty.
    """
    setup_globals()
    assert launcher.config is not None  # set by setup()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    _check_options(launcher)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    jobs: list[Job] = []
    try:
        for i, o in enumerate(job_overrides):
            jobs.append(_compose(launcher, o, initial_job_idx + i))
        refuse_shared_job_dirs(jobs, launcher.job_dirs)
        if launcher.report:
            _claim_sweep_dir(sweep_dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        cluster = one_cluster(jobs)
    except BaseException:  # stopped before anything ran: no job directory is left behind
        _unmake_job_dirs(jobs)
        raise
    launcher.job_dirs.update({j.output_dir: j.num for j in jobs})
    runtime_env = _ray.job_runtime_env(_remote_runtime_env(launcher), cluster)
    capacity, movable = {}, True
    if cluster is not None:
        from rltrain.placement.types import ClusterSpec

        spec = ClusterSpec.from_config(cluster)
        capacity = {n.rank: n.num_devices for n in spec.nodes}
        movable = not spec.node_groups  # configured groups name the jobs' own node ranks
    allocator = SliceAllocator(capacity, movable)
    _refuse_impossible(jobs, allocator)
    _refuse_shared_checkpoint_dirs(jobs)
    session = None
    if any(j.ret is None and (j.needs.uses_ray or j.needs.cluster is None) for j in jobs):
        init = OmegaConf.to_container(launcher.ray_cfg.init, resolve=True)
        session = _ray.connect(init, cluster)  # not for jobs that only plan: they start no Ray
    log.info(
        "rltrain launcher: %d jobs, %d at a time, %s; sweep dir %s",
        len(jobs),
        launcher.max_concurrent_jobs,
        f"on Ray {session.address}" if session is not None else "no Ray (no job to run needs one)",
        sweep_dir,
    )
    tmp = tempfile.mkdtemp(prefix="rltrain-sweep-")
    try:
        _run_all(launcher, jobs, _Drivers(launcher, session, tmp, runtime_env), allocator)
    except BaseException:
        if launcher.report:  # Ctrl-C: report what ended; the rest shows as interrupted
            _report_interrupted(launcher, jobs, sweep_dir)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if launcher.report:
        _report_jobs(launcher, jobs, sweep_dir)
    failed = [j for j in jobs if j.ret is not None and j.ret.status == JobStatus.FAILED]
    if failed:
        log.error(
            "rltrain launcher: %d of %d jobs failed:\n%s",
            len(failed),
            len(jobs),
            "\n".join(_failure_lines(j) for j in failed),
        )
    return [j.ret for j in jobs]  # type: ignore[misc]
