"""The benchmark harness: a registry of named measures, a runner, and JSON / Markdown writers.

A *measure* is a function registered with :func:`measure`; given ``quick`` it returns a
:class:`Suite`: named cases (each a zero-argument callable to time), one of which is the
same-run *baseline*. The runner times every case after warm-up calls, several times, and reports
the median, the spread (min, max, interquartile range) and the ratio of each case's median to the
baseline's (a case of another workload size names its own baseline, a case of its size). Cases
may carry a ``size`` (nodes, tokens, ...): then the report adds the fitted scaling exponent (1.0
is linear) and each case's cost per unit of size relative to the baseline.

Measures live as modules under :mod:`rltrain.bench.measures`; :func:`discover` imports every
module there, so adding a file is enough to register a measure. Keep imports of heavy libraries
(ray, torch) inside the measure function, so listing measures stays cheap.

Cluster: by default each measure starts what it needs (a local Ray with simulated devices, the
embedded default). ``--address`` / ``cluster=ray`` (:func:`cluster_address`) makes the runner
join an existing Ray cluster once, before any measure (:func:`connect`); the measures' own
``Cluster.start`` / ``start_job`` then reuse that connection instead of starting a local Ray, and
:data:`ADDRESS_ENV` tells measures that read it where they run.

Speed is reported, never asserted: ratios against a baseline taken in the same run are what
compare across machines.
"""

from __future__ import annotations

import atexit
import datetime
import importlib
import json
import math
import os
import pkgutil
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rltrain.errors import ConfigError, ResourceError

Clock = Callable[[], float]

#: Environment variable naming the Ray cluster the measures run on (``auto`` or ``host:port``);
#: unset: the embedded default (each measure starts a local Ray with simulated devices).
ADDRESS_ENV = "RLTRAIN_BENCH_ADDRESS"
#: How results name the embedded default cluster.
LOCAL = "local (embedded default)"
#: What ``cluster=NAME`` on the bench command line means: the address to join (None: local).
CLUSTER_CHOICES: Mapping[str, str | None] = {"local": None, "ray": "auto"}


@dataclass(frozen=True)
class Case:
    """One thing to time.

    Attributes:
        name: the case's name within its measure (``"nodes=8"``).
        fn: the call to time; its return value is ignored.
        size: the problem size, for the scaling fit (None: no fit).
        work: units of work one call does, for a throughput column (None: none).
        work_unit: what ``work`` counts (``"tokens"``).
        warmup: untimed calls before timing (None: the suite's).
        repeats: timed calls (None: the suite's); a long end-to-end case may ask for fewer.
        baseline: the case its ratios are against (None: the suite's); a suite of several
            workload sizes names the case of the same size, so a ratio compares like with like.
    """

    name: str
    fn: Callable[[], Any]
    size: float | None = None
    work: float | None = None
    work_unit: str = ""
    warmup: int | None = None
    repeats: int | None = None
    baseline: str | None = None


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
    #: Called once after the cases ran, before ``teardown``: named figures derived from the run
    #: (a model's prediction to compare with, a sanity count), kept with the results.
    extras: Callable[[], Mapping[str, float]] | None = None


@dataclass(frozen=True)
class Measure:
    """A registered measure.

    Attributes:
        share: measures with the same ``share`` that run one after another in one bench process
            may keep one resource between them (:func:`shared`): the runner releases it after
            each measure unless the next one has the same ``share``. None: shares nothing.
    """

    name: str
    description: str
    build: Callable[[bool], Suite]
    share: str | None = None


@dataclass(frozen=True)
class CaseResult:
    """Timings of one case (seconds); ``baseline``: the case its ratios are against when that
    is not the measure's baseline (None: the measure's)."""

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
    warmup: int = 0
    baseline: str | None = None


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
    extras: dict[str, float] = field(default_factory=dict)
    machine: str = field(default_factory=lambda: machine_label())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def result_from_dict(d: dict[str, Any]) -> MeasureResult:
    """A :class:`MeasureResult` read back from ``results.json`` (:meth:`MeasureResult.to_dict`)."""
    cases = tuple(CaseResult(**{**c, "samples": tuple(c["samples"])}) for c in d["cases"])
    # results written before headings named the machine: no machine, rather than this one
    return MeasureResult(**{"machine": "", **d, "cases": cases})


_REGISTRY: dict[str, Measure] = {}


def measure(
    name: str, description: str = "", share: str | None = None
) -> Callable[[Callable[[bool], Suite]], Callable]:
    """Register a measure under ``name``.

    Args:
        name: the name ``python -m rltrain.bench NAME`` selects.
        description: one line for the report.
        share: the key of a resource it may share with the measures run next to it
            (:attr:`Measure.share`, :func:`shared`).

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
            name, description or (fn.__doc__ or "").strip().split("\n")[0], fn, share
        )
        return fn

    return register


def discover() -> dict[str, Measure]:
    """Import every module of :mod:`rltrain.bench.measures` and return the registry by name."""
    import rltrain.bench.measures as measures

    for info in pkgutil.iter_modules(measures.__path__):
        importlib.import_module(f"{measures.__name__}.{info.name}")
    return dict(sorted(_REGISTRY.items()))


#: Resources measures share (:func:`shared`): key -> (resource, its close call).
_SHARED: dict[str, tuple[Any, Callable[[], None]]] = {}


def shared(key: str, make: Callable[[], tuple[Any, Callable[[], None]]]) -> Any:
    """The resource under ``key``, made by ``make`` on first use and kept for the next measure.

    Quick modes use it to start one job for several measures of the same ``share``
    (:attr:`Measure.share`) run one after another; :func:`release_shared` closes it (the bench
    runner does after a measure unless the next has the same ``share``, and at exit).

    Args:
        key: the resource's name.
        make: returns ``(resource, close)``.

    Returns:
        The resource.
    """
    if key not in _SHARED:
        _SHARED[key] = make()
        atexit.register(release_shared)
    return _SHARED[key][0]


def release_shared() -> None:
    """Close every resource :func:`shared` made (each once, the newest first)."""
    while _SHARED:
        _, (_, close) = _SHARED.popitem()
        close()


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


def counts(case: Case, suite: Suite, quick: bool) -> tuple[int, int]:
    """Warm-up and timed calls for one case: its own or the suite's, capped in quick mode.

    Returns:
        ``(warmup, repeats)``; quick mode (a check that the measure runs, not a figure) caps
        them at 1 and 1, and there is always one timed call.
    """
    warmup = suite.warmup if case.warmup is None else case.warmup
    repeats = suite.repeats if case.repeats is None else case.repeats
    if quick:
        warmup, repeats = min(warmup, 1), 1
    return max(warmup, 0), max(repeats, 1)


def run_measure(m: Measure, quick: bool = False, clock: Clock = time.perf_counter) -> MeasureResult:
    """Run one measure: every case after warm-up, several times; summarise against the baseline.

    Args:
        m: the measure.
        quick: the measure's quick mode (small sizes, one or two repeats), for CI.
        clock: the clock (tests pass a fake one).

    Returns:
        The results.

    Raises:
        ConfigError: when the suite's baseline, or a case's, names no case.
    """
    suite = m.build(quick)
    names = [c.name for c in suite.cases]
    wanted = [suite.baseline, *(c.baseline for c in suite.cases if c.baseline is not None)]
    missing = [b for b in wanted if b not in names]
    if missing:
        if suite.teardown is not None:
            suite.teardown()
        raise ConfigError(
            f"bench measure {m.name!r}: baseline {missing[0]!r} is not a case of {names}"
        )
    plan = {c.name: counts(c, suite, quick) for c in suite.cases}
    try:
        raw = {c.name: time_case(c, *plan[c.name], clock) for c in suite.cases}
        extras = {k: float(v) for k, v in (suite.extras() if suite.extras else {}).items()}
    finally:
        if suite.teardown is not None:
            suite.teardown()
    results = _results(suite, raw, {name: warmup for name, (warmup, _) in plan.items()})
    sized = [(c.size, r.median) for c, r in zip(suite.cases, results, strict=True) if c.size]
    return MeasureResult(
        name=m.name,
        description=m.description,
        baseline=suite.baseline,
        quick=quick,
        cases=tuple(results),
        scaling_exponent=scaling_exponent(sized),
        note=suite.note,
        extras=extras,
    )


def _results(
    suite: Suite, raw: dict[str, list[float]], warmups: dict[str, int]
) -> list[CaseResult]:
    """Each case's summary against its baseline: its own (``Case.baseline``), itself when
    other cases name it as theirs (the baseline of its size), else the suite's."""
    by_name = {c.name: c for c in suite.cases}
    named = {c.baseline for c in suite.cases if c.baseline is not None} - {suite.baseline}
    results = []
    for c in suite.cases:
        own = c.baseline or (c.name if c.name in named else None)
        base_case = by_name[own or suite.baseline]
        base = statistics.median(raw[base_case.name])
        results.append(_case_result(c, raw[c.name], warmups[c.name], base, base_case, own))
    return results


def _case_result(
    c: Case, xs: list[float], warmup: int, base: float, base_case: Case, baseline: str | None
) -> CaseResult:
    med = statistics.median(xs)
    q1, q3 = _quartiles(xs)
    per_size = None
    if c.size and base_case.size and base > 0:
        per_size = (med / c.size) / (base / base_case.size)
    return CaseResult(
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
        warmup=warmup,
        baseline=baseline,
    )


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}g}"


#: The columns of a result table :func:`markdown` writes.
COLUMNS = (
    "case",
    "samples",
    "median s",
    "min s",
    "max s",
    "IQR s",
    "ratio vs baseline",
    "per-size ratio",
    "throughput",
)
#: A result table written before the ``samples`` column (its header line). docs/benchmarks.md
#: keeps a few such tables it cannot re-run; each is marked with :data:`EARLIER_FORMAT`.
EARLIER_HEADER = "| " + " | ".join(c for c in COLUMNS if c != "samples") + " |"
#: The line that marks a result table of :data:`EARLIER_HEADER`'s format in its block or section.
EARLIER_FORMAT = "<!-- earlier table format: before the samples column -->"


def table_header() -> str:
    """The header line of the result table :func:`markdown` writes (``| case | samples | ...``)."""
    return "| " + " | ".join(COLUMNS) + " |"


def markdown(results: list[MeasureResult]) -> str:
    """Results as Markdown: one table per measure, with its baseline and scaling fit.

    ``samples`` is the number of timed calls the median and spread come from, ``+N`` the untimed
    warm-up calls before them. Every case some ratio is against is marked ``(baseline)``.
    """
    out = []
    for r in results:
        where = f", {r.machine}" if r.machine else ""
        out.append(f"### `{r.name}` ({r.date}{where}{', quick' if r.quick else ''})\n")
        if r.description:
            out.append(f"{r.description}\n")
        out.append(table_header() + "\n|" + "---|" * len(COLUMNS))
        bases = {r.baseline, *(c.baseline for c in r.cases if c.baseline)}
        for c in r.cases:
            tp = f"{_fmt(c.throughput)} {c.work_unit}/s" if c.throughput else "-"
            mark = " (baseline)" if c.name in bases else ""
            n = f"{len(c.samples)}" + (f" +{c.warmup}" if c.warmup else "")
            out.append(
                f"| {c.name}{mark} | {n} | {_fmt(c.median)} | {_fmt(c.min)} | {_fmt(c.max)} | "
                f"{_fmt(c.iqr)} | {_fmt(c.ratio)} | {_fmt(c.per_size_ratio)} | {tp} |"
            )
        if r.scaling_exponent is not None:
            out.append(
                f"\nScaling exponent (log-log fit of median time on size; 1.0 = linear): "
                f"{r.scaling_exponent:.2f}"
            )
        if r.extras:
            out.append("\n" + "; ".join(f"{k} = {_fmt(v, 4)}" for k, v in r.extras.items()))
        if r.note:
            out.append(f"\n{r.note}")
        out.append("")
    return "\n".join(out)


def machine_label() -> str:
    """The machine in a few words for a figure's heading: its CPUs, memory and accelerators
    (``2 CPUs, 24 GiB, no GPU``; ``16 CPUs, 128 GiB, 1 x NVIDIA H100 80GB HBM3``)."""
    parts = [f"{os.cpu_count()} CPUs"]
    try:
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
        parts.append(f"{kib / 1024**2:.0f} GiB")
    except (OSError, ValueError, IndexError):
        pass
    torch = sys.modules.get("torch")  # the measures import it; the harness never does
    if torch is not None and torch.cuda.is_available():
        n = torch.cuda.device_count()
        parts.append(f"{n} x {torch.cuda.get_device_name(0)}")
    else:
        parts.append("no GPU")
    return ", ".join(parts)


def machine() -> dict[str, Any]:
    """Where the numbers were taken."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cluster": os.environ.get(ADDRESS_ENV) or LOCAL,
    }


# ------------------------------------------------------------------------------------ cluster


def cluster_address(
    args: Sequence[str], address: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[list[str], str | None]:
    """Split the bench command line's cluster overrides from the measure names.

    Accepts the run config's spelling: ``cluster=local`` (the embedded default), ``cluster=ray``
    (join the cluster ``ray start`` made on this machine: address ``auto``) and
    ``cluster.address=HOST:PORT``; ``--address`` says the same as the last. Without any of them the
    address comes from :data:`ADDRESS_ENV` in ``env``.

    Args:
        args: the positional arguments (measure names and ``key=value`` overrides).
        address: the ``--address`` option, or None.
        env: the environment (default ``os.environ``).

    Returns:
        ``(measure names, address or None for the embedded default)``.

    Raises:
        ConfigError: for another override, an unknown cluster, or two that disagree.
    """
    env = os.environ if env is None else env
    names: list[str] = []
    chosen: dict[str, str | None] = {}
    if address is not None:
        chosen["--address"] = address or None
    for arg in args:
        if "=" not in arg:
            names.append(arg)
            continue
        key, value = arg.split("=", 1)
        if key == "cluster":
            if value not in CLUSTER_CHOICES:
                raise ConfigError(
                    f"cluster={value!r} is not valid: choose cluster=local (the embedded "
                    f"default) or cluster=ray (an existing cluster), or pass --address HOST:PORT"
                )
            chosen[arg] = CLUSTER_CHOICES[value]
        elif key == "cluster.address":
            chosen[arg] = value or None
        else:
            raise ConfigError(
                f"{arg!r} is not a bench option: arguments are measure names "
                f"(see --list), cluster=local|ray or cluster.address=HOST:PORT"
            )
    if len(set(chosen.values())) > 1:
        raise ConfigError(f"{' and '.join(chosen)} name different clusters: give one of them")
    if chosen:
        return names, next(iter(chosen.values()))
    return names, env.get(ADDRESS_ENV) or None


def connect(address: str) -> Callable[[], None]:
    """Join the Ray cluster at ``address`` for every measure of this run.

    The measures' ``Cluster.start`` and ``start_job`` find Ray initialised and reuse the
    connection (leaving the cluster running when they finish); :data:`ADDRESS_ENV` is set so
    measures that read it, and the results' ``machine`` record, name the cluster.

    Args:
        address: ``auto`` (the cluster ``ray start`` made on this machine) or ``host:port``.

    Returns:
        A call that disconnects (the cluster keeps running).

    Raises:
        ResourceError: when the cluster cannot be reached.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    try:
        ray.init(address=address, log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ResourceError(
            f"bench --address={address!r}: cannot join the Ray cluster ({exc}). Start it with "
            f"`ray start --head` (and `ray start --address=...` on other nodes), or leave the "
            f"address out to use the embedded default"
        ) from None
    os.environ[ADDRESS_ENV] = address
    return ray.shutdown


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
    ``docs/benchmarks.md``, between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``.

    Raises:
        ConfigError: a block to replace holds text the harness does not render (hand-written
            analysis); nothing is written.
    """
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    check_doc_blocks(path, [r.name for r in results])
    for r in results:
        start, end = markers(r.name)
        block = f"{start}\n{markdown([r])}\n{end}"
        if start in text and end in text:
            head, rest = text.split(start, 1)
            text = head + block + rest.split(end, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def markers(name: str) -> tuple[str, str]:
    """The comments that open and close measure ``name``'s generated block in a Markdown file."""
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def doc_blocks(text: str) -> dict[str, str]:
    """Each measure's generated block in a Markdown text: name -> the text between its markers."""
    found = re.finditer(r"<!-- bench:(\S+) -->\n?(.*?)<!-- /bench:\1 -->", text, re.DOTALL)
    return {m.group(1): m.group(2) for m in found}


def is_generated(name: str, block: str) -> bool:
    """Whether ``block`` has the shape :func:`markdown` renders for measure ``name``: its
    heading, an optional one-line description, the case table under today's header
    (:func:`table_header`), then at most three one-line paragraphs (scaling fit, extras, note).
    Hand-written text (wrapped lines, a second table, more paragraphs) does not, and
    :func:`update_doc` would delete it; nor does a table under another header, unless the block
    holds the :data:`EARLIER_FORMAT` line and its table has :data:`EARLIER_HEADER`."""
    lines = block.strip().split("\n")
    earlier = EARLIER_FORMAT in lines
    text = "\n".join(line for line in lines if line != EARLIER_FORMAT)
    paras = [p for p in re.split(r"\n\s*\n", text.strip()) if p]
    if not paras:
        return not earlier  # an empty block: where the next run's table goes
    heading = re.fullmatch(rf"### `{re.escape(name)}` \([^\n]+\)", paras.pop(0))
    if paras and not paras[0].startswith("|") and "\n" not in paras[0]:
        paras.pop(0)  # the description
    if not heading or not paras:
        return False
    table = paras.pop(0).split("\n")
    header = EARLIER_HEADER if earlier else table_header()
    columns = header.count("|") - 1
    if len(table) < 2 or table[0] != header or table[1] != "|" + "---|" * columns:
        return False
    rest_ok = len(paras) <= 3 and all("\n" not in p and p[0] not in "|#" for p in paras)
    return all(line.startswith("|") for line in table) and rest_ok


def unmarked_earlier_tables(text: str) -> list[str]:
    """The sections of a Markdown text holding a result table of the earlier format
    (:data:`EARLIER_HEADER`, before the ``samples`` column) without the :data:`EARLIER_FORMAT`
    line between their heading and that table.

    Args:
        text: the Markdown text (``docs/benchmarks.md``).

    Returns:
        Each such section's heading line (the text's first line where the table has none).
    """
    found, heading, marked = [], "", False
    for line in text.split("\n"):
        if line.startswith("#"):
            heading, marked = line, False
        elif line == EARLIER_FORMAT:
            marked = True
        elif line == EARLIER_HEADER and not marked:
            found.append(heading or text.split("\n", 1)[0])
    return found


def check_doc_blocks(path: str, names: Sequence[str]) -> None:
    """Refuse to replace a measure's block in ``path`` that holds text the harness did not
    render: replacing it would lose that text.

    Raises:
        ConfigError: naming the file, the block and the fix.
    """
    if not os.path.exists(path):
        return
    with open(path) as f:
        blocks = doc_blocks(f.read())
    foreign = [n for n in names if n in blocks and not is_generated(n, blocks[n])]
    if foreign:
        first = markers(foreign[0])[1]
        raise ConfigError(
            f"--update-docs {path}: the block of {', '.join(foreign)} holds text the bench "
            f"does not write (hand-written figures or analysis), which the update would delete. "
            f"Move that text below {first} (outside the markers), then run again (a table under "
            f"the earlier header {EARLIER_HEADER!r} needs the line {EARLIER_FORMAT} above it)"
        )
