"""Show a plan: table rows for the terminal, and an SVG picture of devices over stages.

The picture follows the spirit of RLinf's collocated / hybrid figures: one column per device,
one row per stage (time runs down), and in each cell one block per component holding memory
there, its height the share of the device's capacity, solid when the component runs and hatched
when it only keeps state resident. Pure string building: no matplotlib, no Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from xml.sax.saxutils import escape

from rltrain.placement.plan import Plan, PlannedProcess
from rltrain.placement.tools import TOOLS
from rltrain.placement.types import GIB
from rltrain.telemetry.palette import component_color


def color(component: str, order: tuple[str, ...] = ()) -> str:
    """The component's colour in every picture (:mod:`rltrain.telemetry.palette`)."""
    return component_color(component, order)


@dataclass(frozen=True)
class Row:
    """One table row: a process, or a run of consecutive ranks that look alike."""

    component: str
    ranks: str
    nodes: str
    devices: str
    shared_with: str
    memory: str


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    if len(set(values)) == 1:
        return str(lo)
    return f"{lo}-{hi}"


def size(b: int) -> str:
    """Bytes for people: MiB below 1 GiB, GiB above."""
    return f"{b / GIB:.2f} GiB" if b >= GIB else f"{b / 2**20:.1f} MiB"


def _mem(plan: Plan, proc: PlannedProcess) -> str:
    if not proc.devices:
        if proc.component == TOOLS and plan.tools is not None:
            t = plan.tools
            return f"{t.cpus_per_worker:g} CPU, {size(t.memory_bytes_per_worker)} host"
        return "-"
    peak = max(plan.memory[(proc.node_rank, d)].peak_bytes for d in proc.devices)
    cap = plan.memory[(proc.node_rank, proc.devices[0])].capacity_bytes
    return f"{size(peak)} of {size(cap)}"


def _shared(plan: Plan, proc: PlannedProcess) -> str:
    others: dict[str, None] = {}
    for d in proc.devices:
        for c in plan.sharing[(proc.node_rank, d)]:
            if c != proc.component:
                others[c] = None
    return ", ".join(others) or "-"


def rows(plan: Plan, max_rows: int = 64) -> list[Row]:
    """Table rows: one per process, or, when there are more than ``max_rows`` processes, one per
    run of consecutive ranks of a component with the same device count, sharing and memory.

    Args:
        plan: the plan.
        max_rows: the most per-process rows before runs are merged.

    Returns:
        The rows in plan order.
    """
    if len(plan.processes) <= max_rows:
        return [
            Row(
                p.component,
                str(p.rank),
                str(p.node_rank),
                ",".join(map(str, p.devices)) or "(node)",
                _shared(plan, p),
                _mem(plan, p),
            )
            for p in plan.processes
        ]
    return list(_merged_rows(plan))


def _merged_rows(plan: Plan) -> Iterator[Row]:
    run: list[PlannedProcess] = []
    key = None
    for p in plan.processes:
        k = (p.component, len(p.devices), _shared(plan, p), _mem(plan, p))
        if run and k != key:
            yield _row(run, key)
            run = []
        run.append(p)
        key = k
    if run:
        yield _row(run, key)


def _row(run: list[PlannedProcess], key) -> Row:
    comp, ndev, shared, memory = key
    devs = sorted({d for p in run for d in p.devices})
    where = f"{ndev} per process, of {_span(devs)}" if devs else "(node)"
    return Row(
        comp,
        _span([p.rank for p in run]),
        _span([p.node_rank for p in run]),
        where,
        shared,
        memory,
    )


def svg(plan: Plan, max_columns: int = 32) -> str:
    """The plan as an SVG picture: devices across, stages down, memory blocks per component.

    Args:
        plan: the plan.
        max_columns: draw at most this many devices (the first ones, in node order); a caption
            says how many were left out.

    Returns:
        The SVG document.
    """
    devices = sorted(plan.memory)[:max_columns]
    col_w, row_h, left, top, gap = 56, 120, 90, 60, 6
    width = left + len(devices) * col_w + 20
    height = top + len(plan.stages) * row_h + 60
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        '<defs><pattern id="hatch" patternUnits="userSpaceOnUse" width="6" height="6">'
        '<path d="M0,6 L6,0" stroke="white" stroke-width="1.5"/></pattern></defs>',
        f'<text x="8" y="18" font-size="14">rltrain plan: {plan.mode.value}, '
        f"{plan.cluster.num_nodes} node(s), {len(plan.memory)} device(s) used</text>",
    ]
    pool = tool_pool_lines(plan)  # the tool pool holds no device: one line under the title
    if pool:
        nodes = "; ".join(line.strip() for line in pool[1:])
        out.append(f'<text x="8" y="36">{escape(pool[0])}; {escape(nodes)}</text>')
    for i, (node, dev) in enumerate(devices):
        x = left + i * col_w
        out.append(f'<text x="{x + 4}" y="{top - 8}">n{node}:d{dev}</text>')
    for j, stage in enumerate(plan.stages):
        y = top + j * row_h
        out.append(f'<text x="8" y="{y + row_h / 2}">{escape(stage)}</text>')
        for i, key in enumerate(devices):
            out.extend(_cell(plan, key, stage, left + i * col_w, y, col_w - gap, row_h - gap))
    out.extend(_legend(plan, top + len(plan.stages) * row_h + 16, len(devices)))
    out.append("</svg>")
    return "\n".join(out)


def _cell(plan: Plan, key, stage: str, x: float, y: float, w: float, h: float) -> list[str]:
    dm = plan.memory[key]
    sm = dm.stage(stage)
    out = [f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="#f4f4f4" stroke="#999"/>']
    per: dict[str, list[int]] = {}
    for t in sm.terms:
        slot = per.setdefault(t.component, [0, 0])
        slot[0 if t.status == "active" else 1] += t.on_device
    bottom = y + h
    for comp, (active, resident) in per.items():
        for amount, hatched in ((active, False), (resident, True)):
            if amount <= 0:
                continue
            bh = max(h * amount / dm.capacity_bytes, 1.0)
            bottom -= bh
            title = f"{comp} {stage}: {size(amount)} ({'resident' if hatched else 'runs'})"
            out.append(
                f'<rect x="{x}" y="{max(bottom, y):.1f}" width="{w}" height="{bh:.1f}" '
                f'fill="{color(comp, plan.components)}"><title>{escape(title)}</title></rect>'
            )
            if hatched:
                out.append(
                    f'<rect x="{x}" y="{max(bottom, y):.1f}" width="{w}" height="{bh:.1f}" '
                    f'fill="url(#hatch)"/>'
                )
    if sm.peak_bytes > dm.capacity_bytes or sm.required_bytes > dm.capacity_bytes:
        out.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="none" stroke="red" '
            f'stroke-width="3"/>'
        )
    return out


def _legend(plan: Plan, y: float, shown: int) -> list[str]:
    out = []
    x = 8
    for comp in plan.components:
        out.append(
            f'<rect x="{x}" y="{y - 10}" width="12" height="12" '
            f'fill="{color(comp, plan.components)}"/>'
        )
        out.append(f'<text x="{x + 16}" y="{y}">{escape(comp)}</text>')
        x += 24 + 7 * len(comp)
    note = "solid: runs in the stage; hatched: resident while idle; red: over capacity"
    out.append(f'<text x="8" y="{y + 20}">{note}</text>')
    if shown < len(plan.memory):
        out.append(
            f'<text x="8" y="{y + 36}">showing the first {shown} of {len(plan.memory)} '
            f"devices</text>"
        )
    return out


def tool_pool_lines(plan: Plan) -> list[str]:
    """The tool pool in words: its sizes, then each node's needs against what it has (empty
    without a pool)."""
    t = plan.tools
    if t is None:
        return []
    out = [
        f"tool pool: {t.workers} worker(s) x {t.cpus_per_worker:g} CPU, "
        f"{size(t.memory_bytes_per_worker)} host memory, {t.concurrency} call(s) at once each, "
        f"{t.timeout_s:g} s per call (tools.*)"
    ]
    for n in t.nodes:
        has = size(n.node_memory_bytes) if n.node_memory_bytes is not None else "unknown"
        out.append(
            f"  node {n.node}: {n.workers} worker(s) need {n.cpus:g} of {n.node_cpus:g} CPUs, "
            f"{size(n.memory_bytes)} of {has} host memory"
        )
    return out
