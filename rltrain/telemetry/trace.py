"""Timeline spans: ``with span("generate", "rollout", devices): ...`` in workers and the driver.

Each process keeps its finished spans in a bounded in-memory buffer; the driver drains the
workers' buffers (``WorkerGroup.collect_spans()`` / ``Cluster.collect_spans()``), adds its own
(:func:`drain`) and writes one Chrome-trace / Perfetto JSON (:func:`write_chrome_trace`) with one
lane per device and one per process. A span on two devices appears on both device lanes.

This module is a leaf: it imports nothing from rltrain, so every layer may record spans.
Timestamps are wall-clock (``time.time_ns``), comparable across processes of one machine and, with
synchronised clocks, across nodes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

#: Spans kept per process before the oldest are dropped (a run that never drains stays bounded).
MAX_SPANS = 100_000
#: The name of the marker :func:`drain` adds when spans were dropped (the count in ``dropped``).
DROPPED = "spans_dropped"


@dataclass(frozen=True)
class Span:
    """One finished span.

    Attributes:
        name: what happened (``generate``, ``train_step``, ``offload``...).
        component: the component it belongs to (``actor``, ``rollout``, ``driver``...).
        devices: device lanes it occupied, e.g. ``("node0/dev1",)``; empty for none.
        process: the process lane, e.g. ``"actor[1]"`` or ``"driver"``.
        start_us: start, microseconds since the epoch.
        dur_us: duration in microseconds.
        pid: the OS process id.
        dropped: on a :data:`DROPPED` marker (zero length), how many of the process's oldest
            spans its full buffer dropped before the drain; 0 on every other span.
    """

    name: str
    component: str
    devices: tuple[str, ...]
    process: str
    start_us: float
    dur_us: float
    pid: int
    dropped: int = 0


_lock = threading.Lock()
_buffer: deque[Span] = deque(maxlen=MAX_SPANS)
_dropped = 0  # spans pushed out of the full buffer since the last drain
_process = "driver"
_enabled = True


def configure(process: str | None = None, enabled: bool | None = None) -> None:
    """Name this process's lane and/or switch recording on or off.

    Args:
        process: the lane name for spans recorded here (the runtime sets ``"<group>[<rank>]"``).
        enabled: False makes :func:`span` a no-op (``logging.trace=false``).
    """
    global _process, _enabled
    if process is not None:
        _process = process
    if enabled is not None:
        _enabled = enabled


def device_label(node_rank: int, device: int) -> str:
    """The lane name of a plan device: ``node<r>/dev<d>``."""
    return f"node{node_rank}/dev{device}"


@contextmanager
def span(name: str, component: str, devices: Sequence[str | int] = ()) -> Iterator[None]:
    """Record the enclosed block as one span (also when it raises).

    Args:
        name: what happens in the block.
        component: the component doing it.
        devices: device lanes (strings such as :func:`device_label` gives; ints become
            ``dev<i>``).

    Yields:
        Nothing; the span is recorded on exit.
    """
    if not _enabled:
        yield
        return
    start = time.time_ns()
    try:
        yield
    finally:
        end = time.time_ns()
        lanes = tuple(d if isinstance(d, str) else f"dev{d}" for d in devices)
        record = Span(
            name, component, lanes, _process, start / 1e3, (end - start) / 1e3, os.getpid()
        )
        global _dropped
        with _lock:
            if len(_buffer) == _buffer.maxlen:
                _dropped += 1
            _buffer.append(record)


def drain() -> list[Span]:
    """Remove and return this process's recorded spans (oldest first), followed by a
    :data:`DROPPED` marker counting the spans the full buffer dropped, if any."""
    global _dropped
    with _lock:
        out = list(_buffer)
        _buffer.clear()
        dropped, _dropped = _dropped, 0
    if dropped:
        now = time.time_ns() / 1e3
        out.append(Span(DROPPED, "trace", (), _process, now, 0.0, os.getpid(), dropped))
    return out


def to_chrome_trace(spans: Iterable[Span]) -> dict:
    """Convert spans to a Chrome-trace document (``{"traceEvents": [...]}``).

    Device lanes come first (sorted), then process lanes (sorted); within a lane, each component
    gets its own row (``tid``).

    Args:
        spans: spans from any number of processes.

    Returns:
        A JSON-serialisable dict that chrome://tracing and ui.perfetto.dev open.
    """
    spans = list(spans)
    device_lanes = sorted({d for s in spans for d in s.devices})
    process_lanes = sorted({s.process for s in spans})
    lane_ids = {("device", d): i + 1 for i, d in enumerate(device_lanes)}
    base = len(device_lanes) + 1
    lane_ids.update({("process", p): base + i for i, p in enumerate(process_lanes)})
    components = sorted({s.component for s in spans})
    tids = {c: i + 1 for i, c in enumerate(components)}
    events: list[dict] = []
    for (kind, name), pid in lane_ids.items():
        label = f"device {name}" if kind == "device" else f"process {name}"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
        )
        for c, tid in tids.items():
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": c}}
            )
    for s in spans:
        args = {"process": s.process, "os_pid": s.pid, "devices": list(s.devices)}
        if s.dropped:
            args["dropped"] = s.dropped
        lanes = [lane_ids[("device", d)] for d in s.devices] + [lane_ids[("process", s.process)]]
        for pid in lanes:
            events.append(
                {
                    "ph": "X",
                    "name": s.name,
                    "cat": s.component,
                    "ts": s.start_us,
                    "dur": s.dur_us,
                    "pid": pid,
                    "tid": tids[s.component],
                    "args": args,
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(spans: Iterable[Span], path: str | os.PathLike) -> Path:
    """Write spans as a Chrome-trace / Perfetto JSON file.

    Args:
        spans: spans from any number of processes.
        path: the output file (parent directories are created).

    Returns:
        The path written.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(to_chrome_trace(spans)))
    return out


def spans_to_dicts(spans: Iterable[Span]) -> list[dict]:
    """Plain dicts of spans (for JSONL or shipping between processes without this class)."""
    return [asdict(s) for s in spans]
