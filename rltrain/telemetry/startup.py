"""Start-up marks: when each phase of a run's start-up ended, in every process that took part.

``rltrain bench startup`` sets :data:`MARKS_ENV` to a file and runs the main command; the
driver and every worker then append one JSON line per mark (:func:`mark`): the phase, the
process, the wall-clock time, the process's CPU seconds so far and its creation time. Without
the variable a mark costs one environment look-up and writes nothing, so the marks stay in the
product: what the bench times is what a user runs.

This module is a leaf: it imports nothing from rltrain (the entry point marks before its
imports), so every layer may mark.
"""

from __future__ import annotations

import json
import os
import time

#: Environment variable naming the file marks are appended to (unset: no marks).
MARKS_ENV = "RLTRAIN_STARTUP_MARKS"


def enabled() -> bool:
    """Whether this process records marks."""
    return bool(os.environ.get(MARKS_ENV))


def mark(phase: str, process: str = "driver") -> None:
    """Record that ``phase`` ended now in this process (nothing unless :data:`MARKS_ENV` is set).

    Args:
        phase: the phase's name (``imports``, ``ray_start``, ``worker_ready`` ...).
        process: who marks (``driver``, or a worker's ``group[rank]``).
    """
    path = os.environ.get(MARKS_ENV)
    if not path:
        return
    record = {
        "phase": phase,
        "process": process,
        "pid": os.getpid(),
        "t": time.time(),
        "cpu_s": time.process_time(),
        "created": _created(),
    }
    # one short append per line: lines from several processes stay whole (O_APPEND)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_marks(path: str) -> list[dict]:
    """The marks a run appended to ``path``, in time order."""
    with open(path) as f:
        marks = [json.loads(line) for line in f if line.strip()]
    return sorted(marks, key=lambda m: m["t"])


def _created() -> float:
    """This process's creation time (seconds since the epoch), from ``/proc`` where it exists.

    Measured against the uptime clock (10 ms resolution), not ``btime`` (whole seconds)."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, ticks after boot
        return time.time() - age
    except (OSError, ValueError, IndexError):
        return float("nan")
