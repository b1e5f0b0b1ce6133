"""Sample the GPU's used memory as the driver reports it, until stopped.

    python3 tools/gpu/memwatch.py OUT.tsv [--interval-ms 50] [--device 0]

Writes ``<unix seconds>\\t<used bytes>`` lines (the first at once, then flushed every
second) until SIGTERM or SIGINT. The driver's figure covers every process on the device (Ray
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


def nvml_reader(device: int) -> Callable[[], int]:
    """A function returning the device's used bytes through NVML."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(device)
    return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


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
    args = ap.parse_args(argv)
    read = reader(args.device)
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
        while not stop:
            time.sleep(period)
            f.write(f"{time.time():.4f}\t{read()}\n")
            if time.monotonic() - last_flush > 1.0:
                f.flush()
                last_flush = time.monotonic()
    return 0


if __name__ == "__main__":
    sys.exit(main())
