"""``python -m rltrain trace <run dir>``: draw a run's timeline as a PNG, one lane per device.

Reads ``<run dir>/trace.json`` (or a trace file given directly), draws one horizontal lane per
plan device (then, with ``--processes``, one per process; by default only processes without a
device of their own, such as the driver or a CPU reward worker), a block per span coloured by
component and labelled with its stage, memory movement (offload, reload, weight sync) hatched and
waits pale, and the device's busy share at the right — the device x time pictures RLinf and
OpenRLHF use to explain placement modes, from a real run. It also prints the utilization table
(:func:`rltrain.telemetry.timeline.format_table`).

The layout (:func:`layout`) is pure and tested on its own; drawing uses matplotlib's Agg backend,
imported only when a picture is drawn.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rltrain.errors import ConfigError
from rltrain.telemetry.palette import COMPONENT_COLORS, component_color  # noqa: F401 (re-exported)
from rltrain.telemetry.timeline import (
    TRACE_PNG,
    format_table,
    headline,
    intervals,
    lane_sort_key,
    load_trace,
    stage_kind,
    summarize,
    trace_devices,
    training_window,
)


@dataclass(frozen=True)
class Block:
    """One span to draw: seconds from the window start, and its row inside the lane."""

    start_s: float
    dur_s: float
    name: str
    component: str
    kind: str
    track: int


@dataclass(frozen=True)
class Lane:
    """One lane of the picture: its blocks and how many rows (tracks) overlaps needed."""

    name: str
    kind: str
    blocks: tuple[Block, ...]
    tracks: int
    busy_fraction: float


def _tracks(items: list[tuple[float, float, Any]]) -> list[tuple[int, Any]]:
    """Greedy interval colouring: each item goes on the first row where it overlaps nothing."""
    ends: list[float] = []
    out = []
    for start, end, item in sorted(items, key=lambda x: (x[0], -x[1])):
        for row, row_end in enumerate(ends):
            if start >= row_end:
                ends[row] = end
                break
        else:
            row = len(ends)
            ends.append(end)
        out.append((row, item))
    return out


def processes_with_devices(doc: Mapping[str, Any]) -> set[str]:
    """The processes that recorded a span on a device of their own (``args.devices``).

    A span's component does not tell: the driver's ``launch`` spans carry the component they
    start (``actor``...), whose workers hold devices, while the driver holds none.

    Args:
        doc: a Chrome-trace document written by :mod:`rltrain.telemetry.trace`.

    Returns:
        The process names (``actor[0]``...) as the process lanes are named.
    """
    out = set()
    for e in doc.get("traceEvents", []):
        args = e.get("args") if e.get("ph") == "X" else None
        if isinstance(args, Mapping) and args.get("devices") and "process" in args:
            out.add(str(args["process"]))
    return out


def layout(doc: Mapping[str, Any], processes: str = "deviceless") -> list[Lane]:
    """Lanes and blocks of a trace, ready to draw.

    Args:
        doc: a Chrome-trace document as :func:`~rltrain.telemetry.timeline.load_trace` returns.
        processes: which process lanes to add after the devices: ``all``, ``deviceless`` (only
            processes with no device of their own, :func:`processes_with_devices`: the
            driver, CPU-only workers) or ``none``.

    Returns:
        Device lanes (the plan's devices, natural order, each even if idle), then process lanes.

    Raises:
        ConfigError: for an unknown ``processes`` value.
    """
    if processes not in ("all", "deviceless", "none"):
        raise ConfigError(f"processes={processes!r} must be 'all', 'deviceless' or 'none'")
    ivs = intervals(doc)
    summary = summarize(doc, trace_devices(doc))
    t0 = summary["start_us"]
    by_lane: dict[tuple[str, str], list] = {}
    for i in ivs:
        by_lane.setdefault((i.lane_kind, i.lane), []).append(i)
    with_devices = processes_with_devices(doc)
    names = [("device", d) for d in summary["devices"]]
    for p in sorted(summary["processes"], key=lane_sort_key):
        if processes == "all" or (processes == "deviceless" and p not in with_devices):
            names.append(("process", p))
    lanes = []
    for kind, name in names:
        items = [(i.start_us, i.end_us, i) for i in by_lane.get((kind, name), [])]
        placed = _tracks(items)
        blocks = tuple(
            Block(
                (i.start_us - t0) / 1e6,
                (i.end_us - i.start_us) / 1e6,
                i.name,
                i.component,
                stage_kind(i.name),
                row,
            )
            for row, i in placed
        )
        rows = summary["devices" if kind == "device" else "processes"]
        tracks = max((b.track for b in blocks), default=0) + 1
        lanes.append(Lane(name, kind, blocks, tracks, rows[name]["busy_fraction"]))
    return lanes


def figure_path(out: str | Path) -> Path:
    """The file a drawing is written to: ``out``, with ``.png`` added when it has no suffix
    (matplotlib picks the format from the suffix, and adds ``.png`` itself to a bare name).

    Args:
        out: the path given (``--out``).

    Returns:
        The path the picture will have.

    Raises:
        ConfigError: for a suffix matplotlib cannot write (``.txt``...).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(out)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise ConfigError(
            f"--out {out}: {path.suffix!r} is not a picture format matplotlib writes; end the "
            f"path with .png (or one of {', '.join('.' + f for f in sorted(formats))})"
        )
    return path


def render(
    doc: Mapping[str, Any], out: str | Path, processes: str = "deviceless", title: str = ""
) -> Path:
    """Draw the trace as a PNG.

    Args:
        doc: the Chrome-trace document.
        out: the path to write (parent directories are created; :func:`figure_path`).
        processes: which process lanes to draw (see :func:`layout`).
        title: the figure's title.

    Returns:
        The path written.

    Raises:
        ConfigError: when the trace has no lanes to draw, or ``out``'s suffix names no
            picture format.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = layout(doc, processes)
    if not lanes:
        raise ConfigError("the trace has no spans and names no devices: nothing to draw")
    rows = sum(lane.tracks for lane in lanes)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * rows), dpi=100)
    _draw_lanes(ax, lanes, None)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = figure_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": DRAWN_BY})
    plt.close(fig)
    return path


def _draw_lanes(ax: Any, lanes: Sequence[Lane], window: float | None) -> float:
    """Draw lanes on one axis (blocks, labels, busy shares, legend); returns the window."""
    from matplotlib.patches import Patch

    if window is None:
        window = max((b.start_s + b.dur_s for ln in lanes for b in ln.blocks), default=1.0) or 1.0
    components = sorted({b.component for lane in lanes for b in lane.blocks})
    rows = sum(lane.tracks for lane in lanes)
    y, ticks, labels = 0.0, [], []
    for i, lane in enumerate(lanes):
        if i and lane.kind != lanes[i - 1].kind:  # a rule between device and process lanes
            ax.axhline(y - 0.1, color="black", linewidth=0.6)
        height = 0.8 / lane.tracks
        top = y
        for b in lane.blocks:
            _draw_block(ax, b, top + b.track * height, height, window, components)
        ticks.append(y + 0.4)
        labels.append(lane.name if lane.kind == "device" else f"{lane.name} (process)")
        ax.text(
            1.005,
            y + 0.4,
            f"busy {100 * lane.busy_fraction:.0f}%",
            va="center",
            fontsize=8,
            transform=ax.get_yaxis_transform(),
        )
        y += 1.0
    ax.set_yticks(ticks, labels, fontsize=9)
    ax.set_ylim(y - 0.1, -0.1)
    ax.set_xlim(0, window)
    ax.set_xlabel("seconds since the first span")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=component_color(c, components), label=c) for c in components]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="moving memory"))
    handles.append(Patch(facecolor="white", edgecolor="grey", alpha=0.5, label="wait"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 - 0.6 / (rows + 2)),
        ncol=min(len(handles), 6),
        fontsize=8,
        frameon=False,
    )
    return window


def _draw_block(
    ax: Any, b: Block, top: float, height: float, window: float, components: Sequence[str]
) -> None:
    color = component_color(b.component, components)
    style: dict[str, Any] = {"facecolor": color, "edgecolor": "white", "linewidth": 0.5}
    if b.kind == "memory":
        style.update(hatch="///", edgecolor="black")
    elif b.kind == "wait":
        style.update(alpha=0.3)
    ax.broken_barh([(b.start_s, b.dur_s)], (top + 0.05 * height, 0.9 * height), **style)
    if b.dur_s >= 0.06 * window and height >= 0.4:
        ax.text(
            b.start_s + b.dur_s / 2,
            top + height / 2,
            b.name,
            ha="center",
            va="center",
            fontsize=7,
            color="white" if b.kind == "compute" else "black",
            clip_on=True,
        )


#: Driver spans that open a step (synchronous, asynchronous and fused steps).
STEP_SPANS = ("generate", "generate_wait", "step")


def step_starts(doc: Mapping[str, Any]) -> list[float]:
    """Start times (s) of the driver's per-step spans, in order."""
    return sorted(
        i.start_us / 1e6
        for i in intervals(doc)
        if i.lane_kind == "process" and i.component == "driver" and i.name in STEP_SPANS
    )


#: Step starts a comparison needs: its steady window runs from the start of the second step to
#: the start of the last (a trace marks no end of its last step), so two steps leave none and the
#: whole trace, worker start-up included, would stand in for it.
MIN_COMPARED_STEPS = 3


def compare(measured: Mapping[str, Any], predicted: Mapping[str, Any]) -> str:
    """Measured against predicted, as a text table: the step period (the median over the steady
    steps) and each device's idle share over the steady window, from the start of the second
    step to the start of the last.

    Args:
        measured: a run's trace (``trace.json`` as loaded).
        predicted: the prediction's trace (a plan's ``plan_trace.json`` as loaded).

    Returns:
        The table; when either trace has fewer than :data:`MIN_COMPARED_STEPS` steps there is no
        steady window, and the text says so in place of the table.
    """
    head = "predicted vs measured (steady steps: from the second step's start to the last's)"
    docs = {"measured": measured, "predicted": predicted}
    starts_of = {name: step_starts(doc) for name, doc in docs.items()}
    short = [f"{name} {len(s)}" for name, s in starts_of.items() if len(s) < MIN_COMPARED_STEPS]
    if short:
        return (
            f"{head}\ntoo few steps to compare ({', '.join(short)}): the steady window needs at "
            f"least {MIN_COMPARED_STEPS} steps; run with trainer.total_steps={MIN_COMPARED_STEPS} "
            f"or more (and whatif.steps={MIN_COMPARED_STEPS} or more for the plan)"
        )
    rows = []
    shares = []
    for name, doc in docs.items():
        starts = starts_of[name]
        gaps = [b - a for a, b in zip(starts[1:], starts[2:], strict=False)]
        rows.append(sorted(gaps)[len(gaps) // 2])
        summary = summarize(doc, trace_devices(doc), window_us=(starts[1] * 1e6, starts[-1] * 1e6))
        shares.append({d: 1 - r["busy_fraction"] for d, r in summary["devices"].items()})
    m, p = rows
    lines = [head, f"{'':<16} {'measured':>10} {'predicted':>10} {'error':>8}"]
    if m:
        lines.append(f"{'s/step':<16} {m:>10.4f} {p:>10.4f} {100 * (p - m) / m:>+7.1f}%")
    for d in sorted(set(shares[0]) | set(shares[1]), key=lane_sort_key):
        a, b = shares[0].get(d), shares[1].get(d)
        fa = "-" if a is None else f"{100 * a:.1f}%"
        fb = "-" if b is None else f"{100 * b:.1f}%"
        diff = "" if a is None or b is None else f"{100 * (b - a):+.1f} pt"
        lines.append(f"{'idle ' + d:<16} {fa:>10} {fb:>10} {diff:>8}")
    return "\n".join(lines)


def from_first_step(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The trace from the start of its first step on (a run's start-up left out), so that a
    run and its prediction share a time axis."""
    starts = step_starts(doc)
    if not starts:
        return dict(doc)
    first = starts[0] * 1e6
    events = [e for e in doc["traceEvents"] if e.get("ph") != "X" or float(e.get("ts", 0)) >= first]
    return {**doc, "traceEvents": events}


def render_pair(
    measured: Mapping[str, Any],
    predicted: Mapping[str, Any],
    out: str | Path,
    processes: str = "deviceless",
    title: str = "",
) -> Path:
    """Draw a measured and a predicted timeline one above the other, on one time scale, each
    from its first step.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = [
        layout(from_first_step(measured), processes),
        layout(from_first_step(predicted), processes),
    ]
    windows = [
        max((b.start_s + b.dur_s for ln in ls for b in ln.blocks), default=1.0) for ls in lanes
    ]
    window = max(windows) or 1.0
    heights = [1.5 + 0.45 * sum(ln.tracks for ln in ls) for ls in lanes]
    fig, axes = plt.subplots(
        2, 1, figsize=(12, sum(heights)), dpi=100, gridspec_kw={"height_ratios": heights}
    )
    for ax, ls, name in zip(axes, lanes, ("measured", "predicted (rltrain.whatif)"), strict=True):
        _draw_lanes(ax, ls, window)
        ax.set_title(f"{name}{': ' + title if title and name == 'measured' else ''}", fontsize=10)
    fig.tight_layout()
    path = figure_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": DRAWN_BY})
    plt.close(fig)
    return path


#: The predicted timeline a ``mode=plan`` run writes (:data:`rltrain.whatif.report.TRACE_FILE`).
PLAN_TRACE = "plan_trace.json"


def _predicted_doc(path: str) -> dict[str, Any]:
    """A predicted trace: a plan directory's ``plan_trace.json`` or a trace file.

    Raises:
        ConfigError: when there is no such trace (a directory without ``plan_trace.json``:
            the hint names ``mode=plan``, which writes it).
    """
    p = Path(path)
    if p.is_dir():
        p = p / PLAN_TRACE
        if not p.is_file():
            raise ConfigError(
                f"--predicted {path}: no {PLAN_TRACE} there; a plan run writes it in its "
                f"output directory (python -m rltrain <the run's overrides> mode=plan): pass "
                f"that directory or the {PLAN_TRACE} file itself"
            )
    return load_trace(p)


def window_note(doc: Mapping[str, Any]) -> str:
    """Which window the table above measures, beside the one ``summary.json`` uses.

    The table covers the whole trace, worker start-up included; ``summary.json`` and
    ``utilization.json`` start where start-up ends (:func:`~rltrain.telemetry.timeline.
    training_window`), so their busy shares are higher on a short run.
    """
    whole = summarize(doc, trace_devices(doc))
    window = training_window(doc)
    text = f"window: the whole trace, {whole['window_s']:.3f} s (worker start-up included)"
    if window is None:
        return text + "; summary.json and utilization.json use the same window"
    trained = headline(summarize(doc, trace_devices(doc), window_us=window))
    busy = trained.get("busy_fraction_mean")
    busy_text = (
        f", devices busy {100 * busy:.0f}% on average (utilization.busy_fraction_mean {busy:.3f})"
        if busy is not None
        else ""
    )
    return (
        f"{text}; summary.json and utilization.json measure from the end of worker start-up: "
        f"{(window[1] - window[0]) / 1e6:.3f} s{busy_text}"
    )


#: Written into every PNG this module draws: a later draw replaces only a PNG carrying it.
DRAWN_BY = "rltrain trace"


def drawn_here(path: Path) -> bool:
    """Whether the PNG at ``path`` was drawn by ``rltrain trace`` (its metadata says so)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)  # matplotlib writes its text chunks before the image data
    except OSError:
        return False
    return head.startswith(b"\x89PNG") and DRAWN_BY.encode() in head


def main(argv: list[str] | None = None, prog: str = "python -m rltrain trace") -> int:
    """Render a run's trace to PNG and print its utilization table.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).
        prog: the program name usage messages show (``rltrain trace`` from the console script).

    Returns:
        0, or 2 when there is no readable trace or ``--out`` names no picture format.
    """
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run directory holding trace.json, or a trace file")
    parser.add_argument(
        "--out",
        help=f"picture to write, its format from the suffix (.png when none; default: "
        f"<run dir>/{TRACE_PNG})",
    )
    parser.add_argument(
        "--processes",
        choices=("all", "deviceless", "none"),
        default="deviceless",
        help="process lanes to draw after the devices (default: deviceless)",
    )
    parser.add_argument(
        "--predicted",
        metavar="PLAN",
        help="also draw the prediction of this run (a mode=plan directory holding "
        "plan_trace.json, or a predicted trace file) under the measured timeline, and print "
        "the step and each device's idle share side by side",
    )
    args = parser.parse_args(argv)
    run = Path(args.run)
    try:
        # before the table: a picture that cannot be written fails the command up front
        out = figure_path(args.out or (run if run.is_dir() else run.parent) / TRACE_PNG)
        doc = load_trace(args.run)
        predicted = _predicted_doc(args.predicted) if args.predicted else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.out and out.exists() and not drawn_here(out):
        print(
            f"error: {out} exists and rltrain trace did not draw it: give --out PATH for the "
            f"drawing (a new file, or one rltrain trace drew)",
            file=sys.stderr,
        )
        return 2
    print(format_table(summarize(doc, trace_devices(doc)), processes=True))
    print(window_note(doc))
    try:
        if predicted is not None:
            print(compare(doc, predicted))
            path = render_pair(doc, predicted, out, args.processes, title=str(run))
        else:
            path = render(doc, out, args.processes, title=str(run))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
