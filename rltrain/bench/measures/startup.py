"""Start-up: how long the main command takes to its first step, and where the time goes.

``python -m rltrain.bench startup`` runs the main command, ``python -m rltrain
trainer.total_steps=1`` (the default run, unchanged), several times, each in a fresh process,
with :data:`rltrain.telemetry.startup.MARKS_ENV` set: the driver and every worker mark when
each phase ends (:func:`rltrain.telemetry.startup.mark`). Meanwhile the bench samples the CPU
time of every process of the run (the driver, Ray's processes, the workers) every 100 ms. It
prints one table: per phase, the median over the runs of its wall seconds, the driver's CPU
seconds and the CPU seconds of all the run's processes together; then, per kind of process
(driver, each Ray helper, workers by the actor class or task they ran), how many there were and
their CPU seconds. On a loaded machine the wall column grows and the CPU columns stay: compare
those first.

The same-run baseline is raw Ray: a fresh interpreter that starts a local Ray, runs one task
and stops it (what any Ray program pays on the machine). The timed case is the whole command,
from its start to its exit.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rltrain.bench import harness
from rltrain.bench.harness import Case, Suite, measure
from rltrain.errors import ConfigError
from rltrain.telemetry.startup import MARKS_ENV, read_marks

#: The command measured (the default run, one step).
COMMAND = ("-m", "rltrain", "trainer.total_steps=1")

#: The phases in order: name, the mark that ends it, what it holds.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("interpreter + imports", "imports", "Python starts; the entry point's imports"),
    ("config + preflight", "preflight", "Hydra composes; every check before Ray"),
    ("Ray start", "ray_start", "local Ray up, the cluster discovered"),
    ("placement group", "placement_group", "the plan on Ray's devices; one reservation"),
    ("worker processes start", "worker_init_begin", "until the last worker runs its __init__"),
    ("worker imports + model build", "workers_ready", "workers' __init__ and ready handshake"),
    ("job set-up", "job_ready", "residency ledger, state sizes"),
    ("first step", "first_step", "step 1 and its evaluation, recorded"),
)
#: After the first step: the rest of a one-step run.
TAIL: tuple[tuple[str, str, str], ...] = (
    ("checkpoint + summary", "run_done", "the last step's save, timeline, curves"),
    ("teardown", "teardown", "actors, placement group and Ray stopped"),
    ("summary printed", "command_done", "the run's summary written and shown"),
    ("exit", "exit", "interpreter shutdown, until the process is gone"),
)

_RAW_RAY = """
import ray
ray.init(address="local", include_dashboard=False)
ray.get(ray.remote(lambda: 1).remote())
ray.shutdown()
"""


#: Ray's helper processes by the script or binary they run (their command line).
_RAY_HELPERS: dict[str, str] = {
    "gcs_server": "Ray GCS",
    "raylet": "Ray raylet",
    "dashboard.py": "Ray dashboard head",
    "log_monitor.py": "Ray log monitor",
    "monitor.py": "Ray autoscaler monitor",
}
#: Ray's helpers that name themselves ``ray::<name>`` once started.
_RAY_TITLES: dict[str, str] = {
    "DashboardAgent": "Ray dashboard agent",
    "RuntimeEnvAgent": "Ray runtime-env agent",
    "IDLE": "Ray worker: idle",
}


def process_kind(titles: Sequence[str]) -> str:
    """What a process of the run was, from the command lines it showed over its life.

    Ray workers retitle themselves ``ray::<Actor>.<method>`` or ``ray::<task>`` while they run
    and ``ray::IDLE`` between tasks: the first title other than ``IDLE`` names the worker.

    Args:
        titles: the process's command lines, in the order they were seen (each joined by
            spaces).

    Returns:
        A short kind, e.g. ``Ray raylet`` or ``Ray worker: FusedWorker``; ``other`` when unknown.
    """
    for title in titles:
        first = title.split(" ", 1)[0]
        if first.startswith("ray::"):
            name = first[len("ray::") :].split(".", 1)[0]
            if name != "IDLE":
                return _RAY_TITLES.get(name, f"Ray worker: {name}")
    for title in titles:
        first = title.split(" ", 1)[0]
        if first.startswith("ray::"):
            return _RAY_TITLES.get(first[len("ray::") :].split(".", 1)[0], "other")
        for arg in title.split(" ")[:3]:
            base = os.path.basename(arg)
            if base in _RAY_HELPERS:
                return _RAY_HELPERS[base]
    return "other"


@dataclass
class CpuSampler:
    """Samples the CPU seconds of a process and all its descendants until stopped.

    A process's last sample before it exits is what it counts (processes that live less than
    one interval are missed): a lower bound, within one interval per process.
    """

    root: int
    interval_s: float = 0.1
    samples: list[tuple[float, float]] = field(default_factory=list)
    _last: dict[int, float] = field(default_factory=dict)
    _titles: dict[int, list[str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> CpuSampler:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.root)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                procs = []
            for p in procs:
                try:
                    t = p.cpu_times()
                    title = " ".join(p.cmdline())
                except psutil.Error:
                    continue
                self._last[p.pid] = t.user + t.system
                seen = self._titles.setdefault(p.pid, [])
                if title and title not in seen:
                    seen.append(title)
            self.samples.append((time.time(), sum(self._last.values())))
            self._stop.wait(self.interval_s)

    def by_kind(self) -> dict[str, tuple[int, float]]:
        """Kind of process -> (how many, their CPU seconds); the sampled root is the driver."""
        out: dict[str, tuple[int, float]] = {}
        for pid, cpu in self._last.items():
            kind = "driver" if pid == self.root else process_kind(self._titles.get(pid, []))
            n, total = out.get(kind, (0, 0.0))
            out[kind] = (n + 1, total + cpu)
        return out

    def at(self, t: float) -> float:
        """CPU seconds of all the processes at wall time ``t`` (the last sample before it)."""
        before = [cpu for when, cpu in self.samples if when <= t]
        return before[-1] if before else 0.0


@dataclass(frozen=True)
class StartupRun:
    """One run's phase ends: wall seconds since the command started, and CPU seconds so far."""

    ends: Mapping[str, float]
    driver_cpu: Mapping[str, float]
    all_cpu: Mapping[str, float]
    processes: Mapping[str, tuple[int, float]] = field(default_factory=dict)


def run_once(workdir: str, extra: Sequence[str] = ()) -> StartupRun:
    """Run the main command once with marks on; where each phase ended.

    Args:
        workdir: a directory for the marks file and the run directory.
        extra: more overrides for the command.

    Returns:
        The run's phase ends.

    Raises:
        RuntimeError: the command failed (with its output's tail), or a mark is missing.
    """
    os.makedirs(workdir, exist_ok=True)
    marks_path = os.path.join(workdir, f"marks-{time.time_ns()}.jsonl")
    run_dir = os.path.join(workdir, f"run-{time.time_ns()}")
    env = {**os.environ, MARKS_ENV: marks_path}
    cmd = [sys.executable, *COMMAND, f"hydra.run.dir={run_dir}", *extra]
    log_path = os.path.join(workdir, f"output-{time.time_ns()}.log")
    with open(log_path, "wb") as log:  # a file, not a pipe: the exit is the driver's own
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        sampler = CpuSampler(proc.pid).start()
        code = proc.wait(timeout=600)
        t_exit = time.time()
        sampler.stop()
    if code != 0:
        with open(log_path, errors="replace") as f:
            raise RuntimeError(f"{' '.join(cmd)} exited {code}:\n{f.read()[-3000:]}")
    run = phase_ends(read_marks(marks_path), t0, t_exit, sampler.at)
    return dataclasses.replace(run, processes=sampler.by_kind())


def phase_ends(
    marks: Sequence[Mapping[str, Any]], t0: float, t_exit: float, all_cpu: Callable[[float], float]
) -> StartupRun:
    """Each phase's end from a run's marks (the last mark of a name: every worker's begin).

    Args:
        marks: the run's marks (:func:`rltrain.telemetry.startup.read_marks`).
        t0: when the command was started (seconds since the epoch).
        t_exit: when it exited.
        all_cpu: CPU seconds of all the run's processes at a wall time.

    Returns:
        The phase ends.

    Raises:
        RuntimeError: a phase's mark is missing.
    """
    last: dict[str, Mapping[str, Any]] = {}
    driver: dict[str, float] = {}
    for m in marks:
        last[m["phase"]] = m
        if m["process"] == "driver":
            driver[m["phase"]] = float(m["cpu_s"])
    ends, dcpu, acpu = {}, {}, {}
    for _, key, _ in PHASES + TAIL:
        if key == "exit":
            t = t_exit
        elif key in last:
            t = float(last[key]["t"])
        else:
            raise RuntimeError(f"no {key!r} mark: found {sorted(last)}")
        ends[key] = t - t0
        acpu[key] = all_cpu(t)
        dcpu[key] = driver.get(key, float("nan"))
    return StartupRun(ends, dcpu, acpu)


def breakdown(runs: Sequence[StartupRun]) -> list[tuple[str, float, float, float]]:
    """Per phase: median wall seconds, driver CPU seconds, all processes' CPU seconds.

    Each is the median over the runs of the phase's own share (its end minus the previous
    phase's end). The driver marks neither a worker's phase nor its own exit: its CPU there is
    NaN, and counted in the next phase it marks. Rows for "command to first step" and "whole
    command" close it.
    """
    rows = []
    prev: str | None = None
    prev_driver: str | None = None
    for name, key, _ in PHASES + TAIL:
        driver = math.nan
        if not math.isnan(runs[0].driver_cpu[key]):
            driver = _median_delta(runs, "driver_cpu", key, prev_driver)
            prev_driver = key
        wall = _median_delta(runs, "ends", key, prev)
        rows.append((name, wall, driver, _median_delta(runs, "all_cpu", key, prev)))
        prev = key
    for name, key in (("command to first step", "first_step"), ("whole command", "exit")):
        rows.append(
            (
                name,
                statistics.median(r.ends[key] for r in runs),
                statistics.median(r.driver_cpu[key] for r in runs),
                statistics.median(r.all_cpu[key] for r in runs),
            )
        )
    return rows


def process_rows(runs: Sequence[StartupRun]) -> list[tuple[str, float, float]]:
    """Per kind of process: the median over the runs of how many there were and their CPU
    seconds (a run without that kind counts 0), the kinds with the most CPU first."""
    kinds = {k for r in runs for k in r.processes}
    rows = []
    for kind in kinds:
        counts = [r.processes.get(kind, (0, 0.0))[0] for r in runs]
        cpus = [r.processes.get(kind, (0, 0.0))[1] for r in runs]
        rows.append((kind, statistics.median(counts), statistics.median(cpus)))
    return sorted(rows, key=lambda row: (-row[2], row[0]))


def _median_delta(runs: Sequence[StartupRun], attr: str, key: str, prev: str | None) -> float:
    values = []
    for r in runs:
        series = getattr(r, attr)
        start = 0.0 if prev is None else series[prev]
        values.append(series[key] - start)
    return statistics.median(values)


def table(rows: Sequence[tuple[str, float, float, float]], n: int) -> str:
    """The breakdown as Markdown."""
    out = [
        f"median of {n} run(s) of `python {' '.join(COMMAND)}`; CPU: user + system seconds",
        "",
        "| phase | wall s | driver CPU s | all processes CPU s |",
        "|---|---|---|---|",
    ]
    for name, wall, dcpu, acpu in rows:
        d = "-" if math.isnan(dcpu) else f"{dcpu:.2f}"  # the driver did not mark it
        out.append(f"| {name} | {wall:.2f} | {d} | {acpu:.2f} |")
    return "\n".join(out)


def process_table(rows: Sequence[tuple[str, float, float]]) -> str:
    """The per-process-kind rows as Markdown."""
    out = ["| process | count | CPU s |", "|---|---|---|"]
    out += [f"| {kind} | {n:g} | {cpu:.2f} |" for kind, n, cpu in rows]
    return "\n".join(out)


def _refuse_a_cluster_to_join() -> None:
    """Both runs time starting a local Ray: a cluster given to join would be ignored."""
    address = os.environ.get(harness.ADDRESS_ENV)
    if address:
        raise ConfigError(
            f"startup times the main command and raw Ray each starting a local Ray, and a "
            f"cluster to join was given ({address!r}): run `rltrain bench startup` without "
            f"--address or cluster=ray"
        )


@measure("startup", "python -m rltrain trainer.total_steps=1: start-up phases, wall and CPU")
def startup_measure(quick: bool) -> Suite:
    """The main command's start-up, against raw Ray start-up in the same run.

    Raises:
        ConfigError: a cluster to join was given: both runs time starting a local Ray.
    """
    _refuse_a_cluster_to_join()
    tmp = tempfile.mkdtemp(prefix="rltrain-bench-startup-")
    runs: list[StartupRun] = []

    def command() -> None:
        runs.append(run_once(tmp))

    def raw_ray() -> None:
        subprocess.run([sys.executable, "-c", _RAW_RAY], check=True, capture_output=True)

    def extras() -> dict[str, float]:
        rows = breakdown(runs)
        kinds = process_rows(runs)
        print(table(rows, len(runs)) + "\n\n" + process_table(kinds), flush=True)
        out = {}
        for name, wall, dcpu, acpu in rows:
            out[f"{name}: wall s"] = wall
            if not math.isnan(dcpu):
                out[f"{name}: driver CPU s"] = dcpu
            out[f"{name}: all CPU s"] = acpu
        for kind, n, cpu in kinds:
            out[f"process {kind}: count"] = n
            out[f"process {kind}: CPU s"] = cpu
        return out

    def teardown() -> None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

    return Suite(
        cases=(
            Case("raw Ray: init, one task, shutdown", raw_ray, warmup=0, repeats=5),
            Case("python -m rltrain trainer.total_steps=1", command, warmup=0, repeats=5),
        ),
        baseline="raw Ray: init, one task, shutdown",
        note="Wall seconds of whole commands, each a fresh process; the phase breakdown "
        "(medians, wall and CPU) is in the extras and printed as a table.",
        extras=extras,
        teardown=teardown,
    )
