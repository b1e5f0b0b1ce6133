"""The benchmark harness: a registry of named measures, a runner, and JSON / Markdown writers.

A *measure* is a function registered with :func:`measure`; given ``quick`` it returns a
:class:`Suite`: named cases (each a zero-argument callable to time), one of which is the
same-run *baseline*. The runner times every case after warm-up calls, several times, and reports
the median, the spread (min, max, interquartile range) and the ratio of each case's median to the
baseline's. Cases may carry a ``size`` (nodes, tokens, ...): then the report adds the fitted
scaling exponent (1.0 is linear) and each case's cost per unit of size relative to the baseline.

Measures live as modules under :mod:`rltrain.bench.measures`; :func:`discover` imports every
module there, so adding a file is enough to register a measure. Keep imports of heavy libraries
(ray, torch) inside the measure function, so listing measures stays cheap.

Speed is reported, never asserted: ratios against a baseline taken in the same run are what
compare across machines.
"""

from __future__ import annotations

import datetime
import importlib
import json
import math
import os
import pkgutil
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rltrain.errors import ConfigError

Clock = Callable[[], float]


@dataclass(frozen=True)
class Case:
    """One thing to time.

    Attributes:
        name: the case's name within its measure (``"nodes=8"``).
        fn: the call to time; its return value is ignored.
        size: the problem size, for the scaling fit (None: no fit).
        work: units of work one call does, for a throughput column (None: none).
        work_unit: what ``work`` counts (``"tokens"``).
    """

    name: str
    fn: Callable[[], Any]
    size: float | None = None
    work: float | None = None
    work_unit: str = ""


@dataclass(frozen=True)
class Suite:
    """What a measure returns: its cases and which one is the baseline."""

    cases: tuple[Case, ...]
    baseline: str
    warmup: int = 1
    repeats: int = 5
    note: str = ""
    #: Called once after the cases ran (or failed): stop actors, free memory the cases held.
    teardown: Callable[[], None] | None = None


@dataclass(frozen=True)
class Measure:
    """A registered measure."""

    name: str
    description: str
    build: Callable[[bool], Suite]


@dataclass(frozen=True)
class CaseResult:
    """Timings of one case (seconds)."""

    name: str
    samples: tuple[float, ...]
    median: float
    min: float
    max: float
    iqr: float
    ratio: float
    size: float | None = None
    per_size_ratio: float | None = None
    throughput: float | None = None
    work_unit: str = ""


@dataclass(frozen=True)
class MeasureResult:
    """One measure's results."""

    name: str
    description: str
    baseline: str
    quick: bool
    cases: tuple[CaseResult, ...]
    scaling_exponent: float | None = None
    note: str = ""
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_REGISTRY: dict[str, Measure] = {}


def measure(name: str, description: str = "") -> Callable[[Callable[[bool], Suite]], Callable]:
    """Register a measure under ``name``.

    Args:
        name: the name ``python -m rltrain.bench NAME`` selects.
        description: one line for the report.

    Returns:
        The decorator; the decorated function takes ``quick: bool`` and returns a :class:`Suite`.

    Raises:
        ValueError: when the name is taken by another function.
    """

    def register(fn: Callable[[bool], Suite]) -> Callable[[bool], Suite]:
        old = _REGISTRY.get(name)
        if old is not None and old.build.__qualname__ != fn.__qualname__:
            raise ValueError(f"benchmark measure {name!r} is registered twice")
        _REGISTRY[name] = Measure(
            name, description or (fn.__doc__ or "").strip().split("\n")[0], fn
        )
        return fn

    return register


def discover() -> dict[str, Measure]:
    """Import every module of :mod:`rltrain.bench.measures` and return the registry by name."""
    from rltrain.bench import measures

    for info in pkgutil.iter_modules(measures.__path__):
        importlib.import_module(f"{measures.__name__}.{info.name}")
    return dict(sorted(_REGISTRY.items()))


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def time_case(
    case: Case, warmup: int, repeats: int, clock: Clock = time.perf_counter
) -> list[float]:
    """Call ``case.fn`` ``warmup`` times untimed, then ``repeats`` times timed.

    Returns:
        The timed durations in seconds, in call order.
    """
    for _ in range(warmup):
        case.fn()
    out = []
    for _ in range(repeats):
        t0 = clock()
        case.fn()
        out.append(clock() - t0)
    return out


def scaling_exponent(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(time) on log(size): 1.0 means time grows linearly."""
    pts = [(math.log(s), math.log(t)) for s, t in points if s and s > 0 and t > 0]
    if len(pts) < 2 or len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    num = sum((x - mx) * (y - my) for x, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return num / den


def run_measure(m: Measure, quick: bool = False, clock: Clock = time.perf_counter) -> MeasureResult:
    """Run one measure: every case after warm-up, several times; summarise against the baseline.

    Args:
        m: the measure.
        quick: the measure's quick mode (small sizes, one or two repeats), for CI.
        clock: the clock (tests pass a fake one).

    Returns:
        The results.

    Raises:
        ConfigError: when the suite's baseline names no case.
    """
    suite = m.build(quick)
    names = [c.name for c in suite.cases]
    if suite.baseline not in names:
        raise ConfigError(
            f"bench measure {m.name!r}: baseline {suite.baseline!r} is not a case of {names}"
        )
    warmup, repeats = (
        (min(suite.warmup, 1), min(suite.repeats, 2)) if quick else (suite.warmup, suite.repeats)
    )
    try:
        raw = {c.name: time_case(c, warmup, max(repeats, 1), clock) for c in suite.cases}
    finally:
        if suite.teardown is not None:
            suite.teardown()
    base_case = next(c for c in suite.cases if c.name == suite.baseline)
    base = statistics.median(raw[suite.baseline])
    results = []
    for c in suite.cases:
        xs = raw[c.name]
        med = statistics.median(xs)
        q1, q3 = _quartiles(xs)
        per_size = None
        if c.size and base_case.size and base > 0:
            per_size = (med / c.size) / (base / base_case.size)
        results.append(
            CaseResult(
                name=c.name,
                samples=tuple(xs),
                median=med,
                min=min(xs),
                max=max(xs),
                iqr=q3 - q1,
                ratio=med / base if base > 0 else math.nan,
                size=c.size,
                per_size_ratio=per_size,
                throughput=c.work / med if c.work and med > 0 else None,
                work_unit=c.work_unit,
            )
        )
    sized = [(c.size, r.median) for c, r in zip(suite.cases, results, strict=True) if c.size]
    return MeasureResult(
        name=m.name,
        description=m.description,
        baseline=suite.baseline,
        quick=quick,
        cases=tuple(results),
        scaling_exponent=scaling_exponent(sized),
        note=suite.note,
    )


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}g}"


def markdown(results: list[MeasureResult]) -> str:
    """Results as Markdown: one table per measure, with its baseline and scaling fit."""
    out = []
    for r in results:
        out.append(f"### `{r.name}` ({r.date}{', quick' if r.quick else ''})\n")
        if r.description:
            out.append(f"{r.description}\n")
        out.append(
            "| case | median s | min s | max s | IQR s | ratio vs baseline | per-size ratio "
            "| throughput |\n|---|---|---|---|---|---|---|---|"
        )
        for c in r.cases:
            tp = f"{_fmt(c.throughput)} {c.work_unit}/s" if c.throughput else "-"
            mark = " (baseline)" if c.name == r.baseline else ""
            out.append(
                f"| {c.name}{mark} | {_fmt(c.median)} | {_fmt(c.min)} | {_fmt(c.max)} | "
                f"{_fmt(c.iqr)} | {_fmt(c.ratio)} | {_fmt(c.per_size_ratio)} | {tp} |"
            )
        if r.scaling_exponent is not None:
            out.append(
                f"\nScaling exponent (log-log fit of median time on size; 1.0 = linear): "
                f"{r.scaling_exponent:.2f}"
            )
        if r.note:
            out.append(f"\n{r.note}")
        out.append("")
    return "\n".join(out)


def machine() -> dict[str, Any]:
    """Where the numbers were taken."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def write(results: list[MeasureResult], out_dir: str) -> tuple[str, str]:
    """Write ``results.json`` and ``results.md`` into ``out_dir``.

    Returns:
        The two paths.
    """
    os.makedirs(out_dir, exist_ok=True)
    js = os.path.join(out_dir, "results.json")
    md = os.path.join(out_dir, "results.md")
    with open(js, "w") as f:
        json.dump({"machine": machine(), "measures": [r.to_dict() for r in results]}, f, indent=1)
    with open(md, "w") as f:
        f.write(markdown(results))
    return js, md


def update_doc(results: list[MeasureResult], path: str) -> None:
    """Replace (or append) each measure's section in a Markdown file such as
    ``docs/benchmarks.md``, between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    for r in results:
        start, end = f"<!-- bench:{r.name} -->", f"<!-- /bench:{r.name} -->"
        block = f"{start}\n{markdown([r])}\n{end}"
        if start in text and end in text:
            head, rest = text.split(start, 1)
            text = head + block + rest.split(end, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)
