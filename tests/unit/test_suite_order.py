"""How the suite is shared between its test processes (tests/suite_order.py): units, order,
and the record read back from a junit report."""

from __future__ import annotations

import pathlib

import pytest
import suite_order


class Item:
    """What suite_order reads of a pytest item: its node id and its ``spread`` mark."""

    def __init__(self, nodeid: str, spread: bool = False, unit: str | None = None) -> None:
        self.nodeid, self.spread, self.unit = nodeid, spread or unit is not None, unit

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        if name != "spread" or not self.spread:
            return None
        return pytest.mark.spread(**({"unit": self.unit} if self.unit else {})).mark


def test_heaviest_unit_first_and_a_files_tests_stay_together_in_order():
    items = [
        Item("tests/unit/a.py::t1"),
        Item("tests/unit/a.py::t2"),
        Item("tests/int/b.py::t1"),
        Item("tests/int/c.py::t1", spread=True),
        Item("tests/int/c.py::t2", spread=True),
        Item("tests/unit/a.py::t3"),
    ]
    seconds = {"tests/int/b.py::t1": 30.0, "tests/int/c.py::t2": 50.0, "tests/unit/a.py::t3": 5.0}
    units = suite_order.order(items, seconds)
    assert [i.nodeid for i in items] == [
        "tests/int/c.py::t2",  # 50 s, a unit of its own (spread)
        "tests/int/b.py::t1",  # 30 s
        "tests/unit/a.py::t1",  # 5.4 s in all: 5 + two unrecorded tests
        "tests/unit/a.py::t2",
        "tests/unit/a.py::t3",
        "tests/int/c.py::t1",  # unrecorded: UNKNOWN_S
    ]
    assert units == [
        "tests/int/c.py::t2",
        "tests/int/b.py",
        "tests/unit/a.py",
        "tests/unit/a.py",
        "tests/unit/a.py",
        "tests/int/c.py::t1",
    ]


def test_tests_marked_with_a_named_unit_go_together_apart_from_their_file():
    items = [
        Item("tests/unit/b.py::m1", unit="one ray"),
        Item("tests/unit/b.py::m2", spread=True),
        Item("tests/unit/b.py::m3", unit="one ray"),
        Item("tests/unit/b.py::m4", spread=True),
    ]
    seconds = {f"tests/unit/b.py::m{i}": s for i, s in ((1, 10.0), (3, 10.0), (4, 15.0))}
    units = suite_order.order(items, seconds)
    assert [i.nodeid for i in items] == [
        "tests/unit/b.py::m1",  # 20 s together
        "tests/unit/b.py::m3",
        "tests/unit/b.py::m4",  # 15 s, alone
        "tests/unit/b.py::m2",
    ]
    assert units == ["one ray", "one ray", "tests/unit/b.py::m4", "tests/unit/b.py::m2"]


def test_an_unrecorded_integration_test_counts_its_budget():
    items = [Item("tests/unit/u.py::a"), Item("tests/integration/i.py::a")]
    suite_order.order(items, {"tests/unit/u.py::a": 19.0})
    assert [i.nodeid for i in items] == ["tests/integration/i.py::a", "tests/unit/u.py::a"]


def test_equal_weights_keep_the_collection_order():
    items = [Item("x.py::a"), Item("y.py::a"), Item("z.py::a")]
    suite_order.order(items, {})
    assert [i.nodeid for i in items] == ["x.py::a", "y.py::a", "z.py::a"]


def test_the_record_from_a_junit_report(tmp_path: pathlib.Path):
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_suite_order" name="test_x[a.b:1]" time="2.34"/>'
        '<testcase classname="tests.unit.test_suite_order" name="test_fast" time="0.1"/>'
        '<testcase classname="tests.unit.test_suite_order.Cls" name="test_m" time="7"/>'
        '<testcase classname="" name="tests.unit.broken" time="3"/>'  # failed to collect
        "</testsuite></testsuites>"
    )
    assert suite_order.durations_from_junit([str(report)]) == {
        "tests/unit/test_suite_order.py::Cls::test_m": 7.0,
        "tests/unit/test_suite_order.py::test_x[a.b:1]": 2.3,
    }


def test_group_names_survive_a_reports_split_and_come_off_again(tmp_path: pathlib.Path):
    units = ["tests/int/c.py::t[a]", "tests/unit/a.py", "tests/unit/a.py", "one-ray", "x.py::t"]
    names = suite_order.group_names(units)
    assert names == {
        "tests/int/c.py::t[a]": "spread-0",
        "tests/unit/a.py": "tests/unit/a.py",
        "one-ray": "one-ray",
        "x.py::t": "spread-3",
    }
    # what a junit report holds once xdist appended each test's group to its node id
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_suite_order" name="test_x[a@b]@spread-0" '
        'time="2"/><testcase classname="tests.unit.test_suite_order" '
        'name="test_y@tests/unit/test_suite_order.py" time="3"/>'
        "</testsuite></testsuites>"
    )
    assert suite_order.durations_from_junit([str(report)]) == {
        "tests/unit/test_suite_order.py::test_x[a@b]": 2.0,
        "tests/unit/test_suite_order.py::test_y": 3.0,
    }
    assert suite_order.without_group("test_z[a@b]") == "test_z[a@b]"


def test_a_missing_or_broken_record_only_changes_the_order(tmp_path: pathlib.Path):
    assert suite_order.load_durations(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("{")
    assert suite_order.load_durations(tmp_path / "bad.json") == {}


def test_modules_with_a_ray_of_their_own_go_out_after_all_others():
    items = [
        Item("tests/integration/scheduler/test_zz_multinode.py::a"),
        Item("tests/unit/u.py::a"),
        Item("tests/integration/reliability/test_zz_node_loss.py::a"),
        Item("tests/integration/r.py::a"),
    ]
    seconds = {
        "tests/integration/scheduler/test_zz_multinode.py::a": 13.0,
        "tests/integration/reliability/test_zz_node_loss.py::a": 18.0,
        "tests/integration/r.py::a": 5.0,
    }
    suite_order.order(items, seconds)
    assert [i.nodeid for i in items] == [
        "tests/integration/r.py::a",
        "tests/unit/u.py::a",
        "tests/integration/reliability/test_zz_node_loss.py::a",  # heaviest of the last
        "tests/integration/scheduler/test_zz_multinode.py::a",
    ]
