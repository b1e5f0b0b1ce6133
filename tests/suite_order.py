"""How the suite's tests are shared between its two test processes (pytest-xdist).

xdist's ``loadgroup`` hands out work units in the order the items were collected; a unit runs
whole on one process. Units here are a test file (its tests share module fixtures), or a single
test where the file is marked ``spread`` (no module fixture: each test may go anywhere), or the
tests marked ``spread(unit=NAME)`` together (a fixture only they share). Units
go out heaviest first, by the seconds each test took in a recorded run (``durations.json``),
so the long ones start while the other process still has short ones to pick up at the end
(longest-processing-time-first); the ``test_zz_*`` modules, which stop the session Ray for one
of their own (:func:`own_ray`), go out after all the others. Stale or missing figures only
change the order, never what runs.

``python tests/suite_order.py REPORT.xml`` rewrites ``durations.json`` from a junit report of
a whole run (``python -m pytest --junitxml=REPORT.xml -o junit_duration_report=total``).
"""

from __future__ import annotations

import json
import pathlib
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable

import pytest

DURATIONS = pathlib.Path(__file__).resolve().parent / "durations.json"
#: Seconds assumed for a test the record does not have (a new test): its directory's budget
#: (tests/README.md: a unit test under 1 s, an integration test under 20 s).
UNKNOWN_S = 0.2
UNKNOWN_INTEGRATION_S = 20.0
#: Tests shorter than this are left out of the record (they count as UNKNOWN_S).
RECORD_MIN_S = 1.0


def load_durations(path: pathlib.Path = DURATIONS) -> dict[str, float]:
    """Seconds per test node id from the record; empty when there is none."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {}


def unit_of(item: pytest.Item) -> str:
    """The work unit of ``item``: its own node id where it is marked ``spread``, the named unit
    where it is marked ``spread(unit=NAME)`` (tests sharing a module fixture that the file's
    other tests do not use), else its file."""
    mark = item.get_closest_marker("spread")
    if mark is not None:
        return mark.kwargs.get("unit") or item.nodeid
    return item.nodeid.split("::", 1)[0]


def unknown_s(nodeid: str) -> float:
    """Seconds assumed for a test the record does not have."""
    return UNKNOWN_INTEGRATION_S if nodeid.startswith("tests/integration/") else UNKNOWN_S


def order(items: list[pytest.Item], durations: dict[str, float]) -> list[str]:
    """Sort ``items`` in place, heaviest unit first, ``test_zz_*`` units last (a unit's tests
    stay in their order), and return each item's unit.

    Args:
        items: the collected items.
        durations: seconds per node id (:func:`load_durations`).

    Returns:
        The unit of each item, in the new order.
    """
    units = {item.nodeid: unit_of(item) for item in items}
    weight: dict[str, float] = {}
    for item in items:
        unit = units[item.nodeid]
        weight[unit] = weight.get(unit, 0.0) + durations.get(item.nodeid, unknown_s(item.nodeid))
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(units[item.nodeid], i)
    items.sort(
        key=lambda it: (
            own_ray(it.nodeid),
            -weight[units[it.nodeid]],
            first_seen[units[it.nodeid]],
        )
    )
    return [units[item.nodeid] for item in items]


def own_ray(nodeid: str) -> bool:
    """Whether the test is in a ``test_zz_*`` module: it stops its process's session Ray for a
    Ray of its own, so its unit goes out after every other (any test after it on that process
    would start the session Ray again: seconds of both cores)."""
    return pathlib.PurePosixPath(nodeid.split("::", 1)[0]).name.startswith("test_zz_")


def group_for_xdist(items: list[pytest.Item]) -> None:
    """Order ``items`` and mark each with its unit as its ``xdist_group`` (``--dist
    loadgroup`` keeps a group on one process)."""
    units = order(items, load_durations())  # sorts items
    names = group_names(units)
    for item, unit in zip(items, units, strict=True):
        item.add_marker(pytest.mark.xdist_group(names[unit]))


def group_names(units: list[str]) -> dict[str, str]:
    """An ``xdist_group`` name per unit. xdist appends ``@NAME`` to each node id, and a report
    splits node ids at ``::`` and ``[``: a unit that is a test's own node id (``spread``) is
    named ``spread-N`` instead, so reports still name the test (:func:`without_group`)."""
    names: dict[str, str] = {}
    for unit in units:
        if unit not in names:
            plain = "::" not in unit and "[" not in unit and "@" not in unit
            names[unit] = unit if plain else f"spread-{len(names)}"
    return names


def without_group(name: str) -> str:
    """A report's test name without the ``@group`` xdist's ``loadgroup`` appended (xdist's
    own rule: an ``@`` after the last ``]``)."""
    at = name.rfind("@")
    return name[:at] if at > name.rfind("]") else name


def durations_from_junit(paths: Iterable[str]) -> dict[str, float]:
    """Seconds per node id (setup, call and teardown) from junit reports, longest kept."""
    out: dict[str, float] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            if not case.get("classname"):  # a module that failed to collect: no test ran
                continue
            module = case.get("classname", "").split(".")
            name, seconds = without_group(case.get("name", "")), float(case.get("time", 0.0))
            # classname is "tests.unit.x.test_file" or "...test_file.Class"
            nodeid = _nodeid(module, name)
            if seconds >= RECORD_MIN_S:
                out[nodeid] = round(max(seconds, out.get(nodeid, 0.0)), 1)
    return dict(sorted(out.items()))


def _nodeid(parts: list[str], name: str) -> str:
    for cut in range(len(parts), 0, -1):
        path = pathlib.Path(*parts[:cut]).with_suffix(".py")
        if (DURATIONS.parent.parent / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    return "::".join([*parts, name])


if __name__ == "__main__":
    record = durations_from_junit(sys.argv[1:])
    DURATIONS.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
    print(f"{len(record)} tests of {RECORD_MIN_S:g} s or more, {sum(record.values()):.0f} s")
