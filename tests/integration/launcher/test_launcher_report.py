"""The job summary contract and the sweep report built from it (pure, hand-computed)."""

from __future__ import annotations

import csv
import json

import pytest

from hydra_plugins.rltrain_launcher import _report
from rltrain.errors import ConfigError
from rltrain.telemetry.summary import (
    SUMMARY_FIELDS,
    objective,
    read_job_summary,
    write_job_summary,
)

GIB = 1024**3


def test_summary_round_trip_fills_missing_fields(tmp_path):
    write_job_summary(tmp_path, {"steps": 2, "steps_per_s": 0.5, "final_reward": float("nan")})
    got = read_job_summary(tmp_path)
    assert got is not None
    assert set(SUMMARY_FIELDS) <= set(got)
    assert got["steps"] == 2 and got["steps_per_s"] == 0.5
    assert got["final_reward"] is None  # NaN is not JSON: written as null
    assert got["tokens_per_s"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2


def test_summary_refuses_wrong_types_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"summary\['steps_per_s'\]='fast'"):
        write_job_summary(tmp_path, {"steps_per_s": "fast"})
    with pytest.raises(ConfigError, match=r"seconds_per_stage.*'train'"):
        write_job_summary(tmp_path, {"seconds_per_stage": {"train": "slow"}})


def test_missing_or_broken_summary_reads_as_none(tmp_path):
    assert read_job_summary(tmp_path) is None
    assert read_job_summary(None) is None
    (tmp_path / "summary.json").write_text("{not json")
    assert read_job_summary(tmp_path) is None


def test_objective_for_sweepers():
    summary = {"steps_per_s": 2.0, "env_steps_per_s": None, "final_accuracy": 0.75}
    assert objective(summary) == 2.0  # no tokens or env steps: falls back to steps/s
    assert objective({**summary, "tokens_per_s": 640}, "throughput") == 640.0
    assert objective(summary, "accuracy") == 0.75
    assert objective(summary, "reward") is None
    with pytest.raises(ConfigError, match="'speed' is not valid"):
        objective(summary, "speed")


def _rows():
    a = _report.make_row(
        {"num": 0, "overrides": ["placement=collocated"], "status": "completed", "error": "",
         "start": 100.0, "end": 102.5, "slice": "n0:d0,d1", "output_dir": "/x/0",
         "objective": 3.0, "placement_mode": None},
        {"placement_mode": "collocated", "steps": 4, "steps_per_s": 2.0, "tokens_per_s": 640.0,
         "seconds_per_stage": {"generate": 0.25, "train": 0.125},
         "peak_memory_bytes_per_device": {"0:1": GIB, "0:0": 2 * GIB},
         "final_reward": 0.5, "final_accuracy": 0.75, "simulated_devices": True,
         "status": "completed", "wall_s": 2.0},
    )  # fmt: skip
    b = _report.make_row(
        {"num": 1, "overrides": ["placement=hybrid"], "status": "failed",
         "error": "ResourceError: too big", "start": None, "end": None, "slice": "",
         "output_dir": "/x/1", "objective": None, "placement_mode": "hybrid"},
        None,
    )  # fmt: skip
    return [a, b]


def test_rows_merge_launcher_facts_with_the_summary():
    a, b = _rows()
    # wall_s is the summary's (the rates' time base), job_s the launcher's end - start
    assert a["wall_s"] == 2.0 and a["job_s"] == 2.5
    assert a["placement_mode"] == "collocated" and a["simulated"] is True
    assert b["placement_mode"] == "hybrid"  # from the plan when the job wrote no summary
    assert b["steps_per_s"] is None and b["status"] == "failed"


def test_markdown_table_has_one_row_per_job_and_blanks_for_missing(tmp_path):
    table = _report.to_markdown(_rows())
    lines = table.splitlines()
    assert lines[0].startswith("| job | overrides | placement | devices | steps/s | tokens/s |")
    assert lines[2] == (
        "| 0 | `placement=collocated` | collocated | n0:d0,d1 | 2 | 640 |  | "
        "generate=0.25 train=0.125 | 0:0=2.00G 0:1=1.00G | - | - | - | 0.5 | 0.75 | sim | "
        "2 | 2.5 | completed |"
    )
    assert lines[3] == (
        "| 1 | `placement=hybrid` | hybrid |  |  |  |  |  |  | - | - | - |  |  |  |  |  | "
        "failed: ResourceError: too big |"
    )
    assert "simulated devices" in table  # the note under the table


def test_memory_in_readable_units():
    assert _report._memory_text({"0:1": 37_536_916, "0:0": 3 * GIB}) == "0:0=3.00G 0:1=36M"


def test_numbers_are_short_and_never_exponents():
    assert [_report._num(v) for v in (2.0, 640.0, 0.12345, 123456.7, None, 3, True)] == [
        "2", "640", "0.123", "123457", "", "3", "True"
    ]  # fmt: skip


def test_overrides_all_jobs_share_are_listed_once():
    rows = [
        _report.make_row({"num": n, "overrides": [f"placement={p}", "trainer.total_steps=2"],
                          "status": "completed"}, None)
        for n, p in enumerate(("collocated", "hybrid"))
    ]  # fmt: skip
    lines = _report.to_markdown(rows).splitlines()
    assert lines[0] == "All jobs: `trainer.total_steps=2`"
    assert lines[4].startswith("| 0 | `placement=collocated` |")
    assert lines[5].startswith("| 1 | `placement=hybrid` |")


def test_csv_has_a_column_per_stage(tmp_path):
    path = tmp_path / "r.csv"
    _report.to_csv(_rows(), str(path))
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1"]
    assert rows[0]["s_generate"] == "0.25" and rows[0]["s_train"] == "0.125"
    assert rows[1]["s_generate"] == "" and rows[1]["tokens_per_s"] == ""
    assert (rows[0]["wall_s"], rows[0]["job_s"], rows[1]["job_s"]) == ("2.0", "2.5", "")
    assert rows[0]["peak_bytes_0:0"] == str(2 * GIB) and rows[0]["peak_bytes_0:1"] == str(GIB)
    assert rows[1]["peak_bytes_0:0"] == ""
    assert rows[1]["error"] == "ResourceError: too big"


def test_report_files_and_chart(tmp_path):
    out = _report.write_report(_rows(), str(tmp_path))
    assert (tmp_path / "sweep_report.csv").is_file() and (tmp_path / "sweep_report.md").is_file()
    assert out["png"] == str(tmp_path / "sweep_throughput.png")
    assert (tmp_path / "sweep_throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _report.throughput_measure(_rows()) == "tokens_per_s"


def test_no_chart_without_throughput(tmp_path):
    rows = [_rows()[1]]
    out = _report.write_report(rows, str(tmp_path))
    assert "png" not in out and not (tmp_path / "sweep_throughput.png").exists()


# A summary as a traced job writes it: Job.write_timeline merges timeline.headline() under
# "utilization" (two devices: busy 0.8 and 0.4, moving memory 0.1 and 0.3, idle gaps 0.5/2.25 s).
UTIL = {
    "busy_fraction_mean": 0.6,
    "busy_fraction_min": 0.4,
    "memory_fraction_mean": 0.2,
    "longest_idle_gap_s": 2.25,
}


def _job(num: int, run_dir) -> dict:
    return {"num": num, "overrides": [f"seed={num}"], "status": "completed",
            "output_dir": str(run_dir)}  # fmt: skip


def test_utilization_from_summary_json_shows_as_columns(tmp_path):
    traced, untraced = tmp_path / "0", tmp_path / "1"
    write_job_summary(traced, {"steps": 2, "utilization": UTIL})
    write_job_summary(untraced, {"steps": 2})  # logging.trace=false: no utilization
    rows = [
        _report.make_row(_job(n, d), read_job_summary(d)) for n, d in enumerate((traced, untraced))
    ]
    assert (rows[0]["busy_mean"], rows[0]["busy_min"]) == (0.6, 0.4)
    assert (rows[0]["moving_memory"], rows[0]["longest_idle_s"]) == (0.2, 2.25)
    assert rows[1]["busy_mean"] is None and rows[1]["longest_idle_s"] is None
    lines = _report.to_markdown(rows).splitlines()
    assert lines[0].startswith("| job |")  # no override is shared: no "All jobs" line
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:4]]
    at = header.index("busy mean/min")
    assert header[at : at + 3] == ["busy mean/min", "moving mem", "longest idle s"]
    assert cells[0][at : at + 3] == ["60%/40%", "20%", "2.25"]
    assert cells[1][at : at + 3] == ["-", "-", "-"]
    # the legend, since one job has it
    assert "*busy* is the share of the training window" in lines[-1]


def test_utilization_columns_in_csv_and_no_legend_without_any(tmp_path):
    write_job_summary(tmp_path / "0", {"utilization": UTIL})
    rows = [_report.make_row(_job(0, tmp_path / "0"), read_job_summary(tmp_path / "0")),
            _report.make_row(_job(1, tmp_path / "1"), None)]  # fmt: skip
    _report.to_csv(rows, str(tmp_path / "r.csv"))
    with open(tmp_path / "r.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert [got[0][k] for k in _report.UTILIZATION] == ["0.6", "0.4", "0.2", "2.25"]
    assert [got[1][k] for k in _report.UTILIZATION] == ["", "", "", ""]
    assert "*busy*" not in _report.to_markdown(rows[1:])


def test_malformed_utilization_reads_as_absent():
    bad = {"utilization": {"busy_fraction_mean": "high", "busy_fraction_min": float("nan"),
                           "memory_fraction_mean": True}}  # fmt: skip
    row = _report.make_row(_job(0, "/x"), bad)
    assert [row[k] for k in _report.UTILIZATION] == [None] * 4
    assert _report.make_row(_job(0, "/x"), {"utilization": "oops"})["busy_mean"] is None


def test_small_shares_keep_a_decimal():
    assert [_report._pct(v) for v in (None, 0.6, 0.1, 0.0329, 0.0)] == [
        "-", "60%", "10%", "3.3%", "0.0%"
    ]  # fmt: skip
