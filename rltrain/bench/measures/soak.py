"""Soak: long runs of the shipped schedules, watching every process's memory and the object store.

Two phases, each a real job on the embedded default (simulated devices): the fused collocated
default (``python -m rltrain``) for 2,000 steps, and the asynchronous disaggregated schedule
(``placement=disaggregated trainer.max_staleness=1``) for 500 steps. ``SAMPLES`` times per
phase, evenly spaced, the resident memory (RSS) of the driver and of every process under it
(Ray's raylet and GCS, the workers) and the object store's usage are sampled. Growth is measured
from the end of the warm-up (the first 10 % of the steps: allocator pools and Ray's first leases
settle there) to the end. Targets: every process grows by less than 5 % after warm-up,
and no object is left in the store once the loop has drained. ``--quick`` (CI: 4 steps each)
runs both phases' jobs on one local Ray; a full run starts one per phase.

The object store is read through Ray's ``memory_summary`` (an internal API; the figures are
those ``ray memory --stats-only`` prints).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from typing import Any

from rltrain.bench.harness import Case, Suite, measure

SAMPLES = 25  # per phase, evenly spaced over its steps
WARMUP_SHARE = 0.1


@dataclass
class SoakRecord:
    """What one phase saw: samples of ``{process: rss}`` and of the object store."""

    rss: list[dict[str, int]] = field(default_factory=list)
    store: list[tuple[int, int]] = field(default_factory=list)  # (bytes, objects)
    end_objects: int = -1
    end_bytes: int = -1

    def growth(self) -> dict[str, float]:
        """Per process: RSS growth from the end of the warm-up to the last sample (a share)."""
        if len(self.rss) < 3:
            return {}
        start = self.rss[max(1, int(len(self.rss) * WARMUP_SHARE))]
        end = self.rss[-1]
        return {p: end[p] / start[p] - 1 for p in end if start.get(p)}

    def table(self) -> str:
        """Each process: RSS after warm-up, half-way and at the end, growth (largest first)."""
        if len(self.rss) < 3:
            return "(too few samples)"
        first = max(1, int(len(self.rss) * WARMUP_SHARE))
        start, middle, end = self.rss[first], self.rss[(first + len(self.rss)) // 2], self.rss[-1]
        rows = sorted(self.growth().items(), key=lambda kv: -kv[1])
        # The second half's growth tells a plateau (a pool that filled) from a leak (linear).
        return "\n".join(
            f"  {p:<40} {start[p] / 2**20:7.1f} -> {middle.get(p, 0) / 2**20:7.1f} -> "
            f"{end[p] / 2**20:7.1f} MiB  {100 * g:+6.2f} % (second half "
            f"{100 * (end[p] / middle[p] - 1) if middle.get(p) else 0.0:+5.2f} %)"
            for p, g in rows
        )


def is_ray_service(process: str) -> bool:
    """Ray's own daemons (raylet, GCS, agents, log monitor), not rltrain's driver or workers."""
    return not (process.startswith("driver[") or "Worker" in process)


def _processes() -> dict[str, int]:
    """RSS of the driver and of every process under it, keyed ``name[pid]``."""
    import psutil

    me = psutil.Process()
    out = {f"driver[{me.pid}]": me.memory_info().rss}
    for child in me.children(recursive=True):
        try:
            title = " ".join(child.cmdline()[:1]) or child.name()
            name = title.split("/")[-1].split()[0][:40]
            out[f"{name}[{child.pid}]"] = child.memory_info().rss
        except Exception:  # noqa: BLE001 - a process that ended between listing and reading
            continue
    return out


_STORE = re.compile(r"Plasma memory usage (\d+) MiB, (\d+) objects")


def _store() -> tuple[int, int]:
    """(bytes, objects) in the object store of the connected Ray."""
    import ray
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    match = _STORE.search(text)
    return (int(match.group(1)) << 20, int(match.group(2))) if match else (-1, -1)


def soak_phase(run: Any, steps: int, record: SoakRecord) -> None:
    """Train ``steps`` steps of ``run`` on a fresh job, sampling memory as it goes."""
    from rltrain.bench.measures.trainer import start_reasoning
    from rltrain.runners.reasoning import ReasoningRunner

    with contextlib.ExitStack() as stack:
        job = start_reasoning(run, stack)
        runner = ReasoningRunner(job)
        runner.schedule.begin(0, steps)
        every = max(1, steps // SAMPLES)
        for step in range(steps):
            runner.train_step(step)
            if step % every == 0 or step == steps - 1:
                record.rss.append(_processes())
                record.store.append(_store())
        runner.schedule.drain()
        runner.schedule.end(steps, clean=True)
        del runner  # its last weight export is held by the runner, not leaked
        import gc

        gc.collect()
        record.end_bytes, record.end_objects = _store()


def _runs(quick: bool) -> dict[str, tuple[Any, int]]:
    from rltrain.bench.measures.trainer import compose

    quiet = ("logging.progress=false", "logging.trace=false", "trainer.save_every=0")
    fused = compose(*quiet)
    asynchronous = compose(*quiet, "placement=disaggregated", "trainer.max_staleness=1")
    return {
        # --quick: 4 steps, one sample each: the fewest that leave the warm-up's sample out and
        # give the table three distinct readings (after warm-up, half-way, end)
        "fused collocated": (fused, 4 if quick else 2000),
        "async disaggregated": (asynchronous, 4 if quick else 500),
    }


@measure("soak", "2,000 fused + 500 async steps: RSS growth after warm-up (< 5 %), store empty")
def soak(quick: bool) -> Suite:
    runs = _runs(quick)
    records = {name: SoakRecord() for name in runs}
    cluster = None
    if quick:
        # --quick (CI) checks the path: one local Ray for both phases (each phase's job still
        # starts and ends its own workers). A full run gives each phase a Ray of its own, so
        # the second phase's Ray services start fresh.
        from rltrain.scheduler import Cluster

        cluster = Cluster.start(next(iter(runs.values()))[0].cluster)

    def phase(name: str):
        def go() -> None:
            run, steps = runs[name]
            records[name] = SoakRecord()
            soak_phase(run, steps, records[name])
            print(f"soak, {name}: RSS per process after warm-up -> end\n{records[name].table()}")

        return go

    def extras() -> dict[str, float]:
        out: dict[str, float] = {}
        for name, rec in records.items():
            key = name.replace(" ", "_")
            growth = rec.growth()
            if growth:
                ours = [g for p, g in growth.items() if not is_ray_service(p)]
                rays = [g for p, g in growth.items() if is_ray_service(p)]
                out[f"{key}_max_rss_growth_pct_rltrain"] = 100 * max(ours, default=0.0)
                out[f"{key}_max_rss_growth_pct_ray_services"] = 100 * max(rays, default=0.0)
                total_start = sum(rec.rss[max(1, int(len(rec.rss) * WARMUP_SHARE))].values())
                out[f"{key}_total_rss_growth_pct"] = 100 * (
                    sum(rec.rss[-1].values()) / total_start - 1
                )
                out[f"{key}_processes"] = float(len(rec.rss[-1]))
            out[f"{key}_objects_left"] = float(rec.end_objects)
            out[f"{key}_store_mib_left"] = rec.end_bytes / 2**20
            out[f"{key}_store_peak_mib"] = max((b for b, _ in rec.store), default=0) / 2**20
        return out

    names = list(runs)
    return Suite(
        cases=tuple(
            Case(
                f"{name}, {runs[name][1]} steps",
                phase(name),
                work=runs[name][1],
                work_unit="steps",
                warmup=0,
                repeats=1,
            )
            for name in names
        ),
        baseline=f"{names[0]}, {runs[names[0]][1]} steps",
        warmup=0,
        repeats=1,
        note=(
            "memory, not time, is the point: see the extras (RSS growth per process from the end "
            f"of the first {WARMUP_SHARE:.0%} of the steps to the end; goal < 5 %; objects left "
            f"in the store after the loop drained; goal 0). {SAMPLES} samples per phase; "
            f"simulated devices, {os.cpu_count()} cores."
        ),
        extras=extras,
        teardown=cluster.shutdown if cluster is not None else None,
    )
