"""Rehearse a lease on this CPU machine: the plan's calls, in order, on a local stand-in of the
GPU machine, so that the plan is known to fit before a lease is spent.

For each call of ``lease.py``'s plan:

- what the device tool would send: the tracked and untracked-not-ignored files of the
  repository, and the carried paths (``.gpu_bundle/...``, read from ``--bundles``), checked
  against the tool's limits (64 MiB less ``lease.TREE_MARGIN_BYTES`` by the files' sizes,
  since the tool counts more than they hold; 8 carry paths of at most 200 characters, a
  command of at most 2,000 characters, 10 minutes);
- copied into the stand-in as the tool copies it: on a fresh machine into an empty folder; on
  a warm one over the last call's copy, each carried path replacing what was there and the
  ignored outputs of earlier calls kept;
- its command run there under its timeout (the process group killed past it, as the tool
  does) with ``REHEARSAL=1``: run.sh runs what needs no GPU (staging, unpacking, the machine
  report, the plans of the rltrain runs, publishing) and checks what each GPU step needs;
- what it leaves in ``$OUT`` checked against what the tool hands back (8 files, 16 MiB each,
  64 MiB in all, 2 folders deep, plain names).

Between calls the stand-in keeps its files only when the gap before the next call
(``--gap-s``) is under the 30 s a machine stays warm; past that the next call finds a fresh
machine, which the table charges another start. The table gives each call's device time:
measured here for the steps that need no GPU (their CPU time: this machine is shared, the GPU
machine's 16 cores are not), estimated (``lease.py``) for the others, and the total against
the plan's 12 minutes.

    python3 tools/gpu/rehearse.py [--bundles .gpu_bundle] [--gap-s 20] [--keep DIR] [--json F]

Exit status: 0 the plan fits; 1 a limit is broken, a call failed, or the plan needs more
than 12 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lease  # noqa: E402  (tools/gpu is not a package)

#: Steps whose whole work runs here as it would there: their measured seconds replace the
#: estimates. The others need the GPU: only their CPU part (plans, imports) runs here.
MEASURED_HERE = ("unpack", "env")
_OUT_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class CallReport:
    """What one call did on the stand-in."""

    index: int
    command_chars: int
    carry_paths: int
    sent_bytes: int
    problems: tuple[str, ...]
    fresh_machine: bool
    copy_s: float = 0.0
    rc: int | None = None
    wall_s: float = 0.0
    steps: Mapping[str, Mapping] = field(default_factory=dict)
    out_files: tuple[str, ...] = ()
    overhead_s: float = 0.0  # the call's wall time outside its steps: publishing, bookkeeping


def travelling(repo: Path, bundles: Path, carry: Sequence[str]) -> dict[str, Path]:
    """Repository-relative path -> local file, for everything a call sends."""
    files = {str(p.relative_to(repo)): p for p in lease.tree_files(repo)}
    for c in carry:
        src = local_path(repo, bundles, c)
        if src.is_dir():
            files |= {f"{c}/{p.relative_to(src)}": p for p in src.rglob("*") if p.is_file()}
        elif src.is_file():
            files[c] = src
    return files


def local_path(repo: Path, bundles: Path, carried: str) -> Path:
    """Where a carry path is on this machine (``.gpu_bundle/...`` under ``bundles``)."""
    head, _, rest = carried.partition("/")
    if head == ".gpu_bundle":
        return bundles / rest if rest else bundles
    return repo / carried


def call_problems(
    call: lease.Call, repo: Path, bundles: Path, files: Mapping[str, Path]
) -> list[str]:
    """The tool's limits, checked on the real bytes of this call."""
    sent = sum(p.stat().st_size for p in files.values())
    problems = lease.check_call(call, tree=sent - call.carried_bytes)
    problems = [p for p in problems if "MiB travels" not in p]  # recomputed on real bytes
    problems += lease.size_problems(call.index, sent)
    problems += [
        f"call {call.index}: carried path {c} does not exist here"
        for c in call.carry
        if not local_path(repo, bundles, c).exists()
    ]
    return problems


class StandIn:
    """A local folder standing in for the GPU machine: its repository copy and its /tmp."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = root / "machine" / "repo"
        self.home = root / "machine" / "tmp" / "rltrain-gpu"

    def fresh(self) -> None:
        """A new, bare machine."""
        shutil.rmtree(self.root / "machine", ignore_errors=True)
        self.repo.mkdir(parents=True)

    def receive(self, files: Mapping[str, Path], carry: Sequence[str]) -> float:
        """Copy a call's files in as the tool does; returns the seconds the copy took."""
        t0 = time.monotonic()
        for c in carry:  # a carried path replaces what an earlier call left there
            there = self.repo / c
            if there.is_dir():
                shutil.rmtree(there)
            elif there.exists():
                there.unlink()
        for rel, src in files.items():
            dst = self.repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        return time.monotonic() - t0

    def run(
        self, command: str, timeout_s: int, out: Path, env: Mapping[str, str]
    ) -> tuple[int, float]:
        """Run a call's command in the copy; past ``timeout_s`` its process group is killed
        (rc 124, as the tool reports it). Returns (rc, wall seconds)."""
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        full_env = {
            **os.environ,
            "OUT": str(out),
            "RLTRAIN_GPU_HOME": str(self.home),
            "REHEARSAL": "1",
            "PYTHON": sys.executable,
            **env,
        }
        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.repo,
            env=full_env,
            stdout=(out.parent / f"{out.name}.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            proc.wait()
            rc = 124
        return rc, time.monotonic() - t0


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (one the stand-in started): the command and
    what it left running, in its own process groups too (``timeout`` makes one per step)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[3]) == sid:  # after the command: state, ppid, pgrp, session
            try:
                os.kill(int(stat.parent.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def out_problems(out: Path) -> list[str]:
    """What in ``$OUT`` the tool would not hand back."""
    problems, files = [], [p for p in out.rglob("*") if p.is_file()]
    if len(files) > lease.OUT_LIMIT_FILES:
        problems.append(f"$OUT holds {len(files)} files, the tool returns {lease.OUT_LIMIT_FILES}")
    for p in files:
        rel = p.relative_to(out)
        if p.stat().st_size > lease.OUT_LIMIT_FILE_BYTES:
            problems.append(f"$OUT/{rel} is over 16 MiB")
        if len(rel.parts) > lease.OUT_LIMIT_DEPTH + 1:
            problems.append(f"$OUT/{rel} is more than 2 folders down")
        if not all(_OUT_NAME.match(part) for part in rel.parts):
            problems.append(f"$OUT/{rel}: a name the tool does not return")
    if sum(p.stat().st_size for p in files) > lease.OUT_LIMIT_BYTES:
        problems.append("$OUT holds more than 64 MiB")
    return problems


def rehearse_call(
    call: lease.Call,
    repo: Path,
    bundles: Path,
    standin: StandIn,
    fresh: bool,
    env: Mapping[str, str],
) -> CallReport:
    """One call on the stand-in: limits, copy, command, $OUT."""
    files = travelling(repo, bundles, call.carry)
    problems = call_problems(call, repo, bundles, files)
    report = dict(
        index=call.index,
        command_chars=len(call.command()),
        carry_paths=len(call.carry),
        sent_bytes=sum(p.stat().st_size for p in files.values()),
        fresh_machine=fresh,
    )
    if problems:  # the tool refuses such a call: nothing runs
        return CallReport(**report, problems=tuple(problems))
    if fresh:
        standin.fresh()
    copy_s = standin.receive(files, call.carry)
    out = standin.root / f"out{call.index}"
    rc, wall = standin.run(call.command(), call.timeout_s, out, env)
    problems += out_problems(out)
    results = out / "results.json"
    steps = json.loads(results.read_text())["steps"] if results.is_file() else {}
    if rc != 0:
        problems.append(f"call {call.index}: the command ended with rc {rc}")
    mine = {s: steps[s] for s in call.steps if s in steps}
    return CallReport(
        **report,
        problems=tuple(problems),
        copy_s=round(copy_s, 2),
        rc=rc,
        wall_s=round(wall, 1),
        steps=mine,
        overhead_s=round(max(0.0, wall - sum(f.get("wall_seconds", 0) for f in mine.values())), 1),
        out_files=tuple(sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())),
    )


def rows_of(plan: lease.Plan, reports: Sequence[CallReport]) -> list[lease.Row]:
    """The time table as rehearsed: a start per fresh machine; per call its transfer
    (estimated), each step measured here or estimated, or 0 when it was skipped."""
    o = plan.overheads
    rows = []
    for call, rep in zip(plan.calls, reports, strict=True):
        if rep.fresh_machine:
            rows.append(lease.Row(call.index, "start a machine", o.start_s, "estimate"))
        rows.append(
            lease.Row(call.index, f"send {rep.sent_bytes / lease.MIB:.1f} MiB, return $OUT",
                      lease.transfer_s(rep.sent_bytes, o), "estimate")
        )  # fmt: skip
        used = 0.0
        for name in call.steps:
            step = lease.STEP_BY_NAME[name]
            facts = rep.steps.get(name, {"status": "not run"})
            status = str(facts.get("status", ""))
            if status.startswith("skipped") or status == "not run":
                rows.append(lease.Row(call.index, f"{name}: {status}", 0, "rehearsal", False))
                continue
            if name in MEASURED_HERE and "seconds" in facts:
                # its CPU time: the wall time of single-threaded work on a machine shared with
                # others' jobs says more about them than about the GPU machine's idle cores
                secs = float(facts.get("cpu_seconds", facts["seconds"]))
                basis = f"measured (rehearsal): CPU time; {facts['seconds']} s wall here"
            else:
                cpu = f"; its CPU part took {facts['seconds']} s here" if "seconds" in facts else ""
                secs, basis = step.estimate_s(plan.steps), f"estimate{cpu}"
            fits = used + secs <= call.deadline_s - lease.PUBLISH_S
            rows.append(lease.Row(call.index, f"{name}: {step.what}", secs, basis, fits))
            used += secs if fits else 0
        if call.index < len(plan.calls):
            rows.append(lease.Row(call.index, "gap before the next call", o.gap_s, "estimate"))
    rows.append(lease.Row(0, "give the machine back", o.give_back_s, "estimate"))
    return rows


def rehearse(
    plan: lease.Plan,
    repo: Path,
    bundles: Path,
    standin_dir: Path,
    gaps_s: Sequence[float] = (),
    env: Mapping[str, str] | None = None,
) -> tuple[list[CallReport], list[lease.Row]]:
    """Every call of ``plan`` in order on a stand-in in ``standin_dir``.

    Args:
        plan: the lease plan.
        repo: the repository whose working tree travels.
        bundles: the local folder that stands for ``.gpu_bundle`` in carry paths.
        standin_dir: the stand-in machine's folder (emptied first).
        gaps_s: seconds between call i's end and call i+1 (default: the plan's gap); 30 or
            more and the next call finds a fresh machine.
        env: extra environment for the commands (e.g. ``REHEARSAL_PLAN=0``: no plans).

    Returns:
        One report per call, and the time table.
    """
    standin = StandIn(standin_dir)
    shutil.rmtree(standin_dir, ignore_errors=True)
    reports: list[CallReport] = []
    fresh = True
    for i, call in enumerate(plan.calls):
        reports.append(rehearse_call(call, repo, bundles, standin, fresh, env or {}))
        gap = gaps_s[i] if i < len(gaps_s) else plan.overheads.gap_s
        fresh = gap >= lease.WARM_WINDOW_S  # the machine went back: its files are gone
    return reports, rows_of(plan, reports)


def report_text(plan: lease.Plan, reports: Sequence[CallReport], rows: Sequence[lease.Row]) -> str:
    """What the rehearsal prints: per call its limits and steps, then the time table."""
    lines = []
    sendable = (lease.TREE_LIMIT_BYTES - lease.TREE_MARGIN_BYTES) / lease.MIB
    for call, r in zip(plan.calls, reports, strict=True):
        lines.append(
            f"call {r.index}: sends {r.sent_bytes / lease.MIB:.1f} of {sendable:.0f} MiB, "
            f"{r.carry_paths} of 8 carry paths, command of {r.command_chars} of 2000 "
            f"characters, timeout {call.timeout_s} s; {'fresh' if r.fresh_machine else 'warm'} "
            f"machine; copied in {r.copy_s} s; rc {r.rc} in {r.wall_s} s, {r.overhead_s} s of it "
            f"publishing and bookkeeping; $OUT: {', '.join(r.out_files) or '-'}"
        )
        for name, facts in r.steps.items():
            secs = f" ({facts['seconds']} s here)" if "seconds" in facts else ""
            lines.append(f"  {name}: {facts['status']}{secs}")
        lines += [f"  PROBLEM: {p}" for p in r.problems]
    lines += ["", lease.markdown_table(plan, rows)]
    return "\n".join(lines)


def fits(reports: Sequence[CallReport], rows: Sequence[lease.Row]) -> bool:
    """No problem in any call, and the device time within the plan's 12 minutes."""
    return not any(r.problems for r in reports) and lease.total_s(rows) <= lease.PLAN_BUDGET_S


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundles", type=Path, default=Path(".gpu_bundle"))
    ap.add_argument("--repo", type=Path, default=lease.HERE.parents[1])
    ap.add_argument("--steps", type=int, default=6, help="training steps of every run")
    ap.add_argument("--gap-s", default="", help="comma-separated gaps between calls, seconds")
    ap.add_argument("--with-fallback", action="store_true", help="carry the fallback bundle too")
    ap.add_argument("--no-plan", action="store_true", help="skip the rltrain runs' mode=plan")
    ap.add_argument("--keep", type=Path, help="the stand-in's folder (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="write the reports and the table here")
    args = ap.parse_args(argv)
    names = lease.bundle_order(lease.plan_steps(lease.STEPS, args.with_fallback))
    try:
        parts = lease.read_parts(args.bundles, names)
        plan = lease.make_plan(parts, lease.TREE_BUDGET_BYTES, args.steps,
                               with_fallback=args.with_fallback)  # fmt: skip
    except FileNotFoundError as exc:
        print(f"rehearse: {exc.filename} is missing: build the bundles first "
              f"(bash tools/gpu/build.sh)", file=sys.stderr)  # fmt: skip
        return 2
    except ValueError as exc:
        print(f"rehearse: {exc}", file=sys.stderr)
        return 2
    gaps = [float(g) for g in args.gap_s.split(",") if g]
    env = {"REHEARSAL_PLAN": "0"} if args.no_plan else {}
    with tempfile.TemporaryDirectory(prefix="rehearsal-") as tmp:
        standin = args.keep or Path(tmp)
        reports, rows = rehearse(plan, args.repo.resolve(), args.bundles.resolve(), standin,
                                 gaps, env)  # fmt: skip
    print(report_text(plan, reports, rows))
    if args.json:
        args.json.write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%d"), "calls": [c.as_run_args() for c in plan.calls],
             "reports": [asdict(r) for r in reports], "rows": [asdict(r) for r in rows],
             "total_s": lease.total_s(rows), "fits": fits(reports, rows)}, indent=1))  # fmt: skip
    return 0 if fits(reports, rows) else 1


if __name__ == "__main__":
    sys.exit(main())
