"""Sample the GPU's used memory as the driver reports it, until stopped.

    python3 tools/gpu/memwatch.py OUT.tsv [--interval-ms 50] [--device 0] [--procs PROCS.tsv]

Writes ``<unix seconds>\\t<used bytes>`` lines (the first at once, then flushed every
second) until SIGTERM or SIGINT. With ``--procs``, every fifth sample also writes one
``<unix seconds>\\t<pid>\\t<used bytes>\\t<process title>`` line per process on the device
(NVML only): which process held what (the actor, a torch rollout, vLLM asleep), the split a
per-device figure cannot give. The driver's figure covers every process on the device (Ray
workers, vLLM's engine core, the CUDA contexts), which is what a plan's per-device prediction
is about; ``collect.py`` matches the samples with the spans of a run's ``trace.json``
(wall-clock microseconds). NVML comes from ``nvidia-ml-py`` (on the GPU machine); without it,
``nvidia-smi`` is polled instead.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def _nvml_handle(device: int) -> tuple[Any, Any]:
    """``pynvml`` started, and the device's handle."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device)


def nvml_reader(device: int) -> Callable[[], int]:
    """A function returning the device's used bytes through NVML."""
    pynvml, handle = _nvml_handle(device)
    return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def nvml_processes(device: int) -> Callable[[], list[tuple[int, int, str]]]:
    """Each compute process on the device, through NVML.

    Args:
        device: the device's index.

    Returns:
        A function listing ``(pid, used bytes, process title)`` of each compute process.

    Raises:
        ImportError: ``pynvml`` is not installed; NVML's own errors when it cannot start.
    """
    pynvml, handle = _nvml_handle(device)

    def title(pid: int) -> str:
        try:  # Ray names its workers in the title ("ray::ActorWorker.train")
            raw = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            return "?"
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120] or "?"

    def read() -> list[tuple[int, int, str]]:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return [(p.pid, int(p.usedGpuMemory or 0), title(p.pid)) for p in procs]

    return read


def smi_reader(device: int) -> Callable[[], int]:
    """The same through ``nvidia-smi`` (MiB resolution, ~20 ms a call)."""

    def read() -> int:
        out = subprocess.run(
            ["nvidia-smi", "-i", str(device), "--query-gpu=memory.used", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(out.split()[0]) * 2**20

    return read


def reader(device: int) -> Callable[[], int]:
    """NVML's reader, or ``nvidia-smi``'s where NVML cannot be loaded."""
    try:
        return nvml_reader(device)
    except Exception:  # no pynvml, or NVML refused: the CLI still works
        return smi_reader(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--interval-ms", type=float, default=50.0)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--procs", help="also write each process's used bytes here (NVML only)")
    args = ap.parse_args(argv)
    read = reader(args.device)
    procs_out = None
    if args.procs:
        try:
            read_procs = nvml_processes(args.device)
            procs_out = open(args.procs, "w")
        except Exception as exc:  # no NVML: the device's figure still comes
            print(f"memwatch: no per-process figures ({type(exc).__name__}: {exc})")
    stop = False

    def on_signal(signum, frame) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    period = args.interval_ms / 1000
    with open(args.out, "w") as f:
        # The first sample is flushed at once: run.sh waits for it before starting the run.
        f.write(f"{time.time():.4f}\t{read()}\n")
        f.flush()
        last_flush = time.monotonic()
        n = 0
        while not stop:
            time.sleep(period)
            now = time.time()
            f.write(f"{now:.4f}\t{read()}\n")
            n += 1
            if procs_out is not None and n % 5 == 0:
                try:
                    rows = read_procs()
                except Exception as exc:  # the device's figure matters more: keep sampling it
                    print(f"memwatch: per-process figures stopped ({type(exc).__name__}: {exc})")
                    procs_out.close()
                    procs_out = None
                else:
                    procs_out.writelines(f"{now:.4f}\t{p}\t{u}\t{t}\n" for p, u, t in rows)
            if time.monotonic() - last_flush > 1.0:
                f.flush()
                if procs_out is not None:
                    procs_out.flush()
                last_flush = time.monotonic()
    if procs_out is not None:
        procs_out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
