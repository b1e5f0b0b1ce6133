"""``python -m rltrain trace``: the lane layout by hand, and the PNG it draws read back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rltrain.errors import ConfigError
from rltrain.telemetry import draw as render
from rltrain.telemetry import timeline
from rltrain.telemetry.trace import Span

S = 1e6


def sp(name, component, devices, process, start_s, dur_s):
    return Span(name, component, tuple(devices), process, start_s * S, dur_s * S, 1)


def doc_of(spans, devices):
    return json.loads(json.dumps(timeline.chrome_trace_with_devices(spans, devices)))


#: Shaped like a real run's: the driver launches each component's workers (a ``launch`` span
#: tagged with the component it starts, on no device), then waits for each step's batch.
SPANS = [
    sp("launch", "actor", [], "driver", 0, 1),
    sp("launch", "rollout", [], "driver", 0, 0.75),
    sp("launch", "reward", [], "driver", 0, 0.5),
    sp("generate_wait", "driver", [], "driver", 1, 4),
    sp("generate", "rollout", ["node0/dev0"], "rollout[0]", 1, 4),
    sp("train", "actor", ["node0/dev0"], "actor[0]", 4, 3),  # overlaps generate: second row
    sp("offload", "actor", ["node0/dev0"], "actor[0]", 7, 1),
    sp("reward", "reward", [], "reward[0]", 5, 1),
]
DEVICES = ["node0/dev0", "node0/dev1"]


def test_layout_by_hand():
    lanes = render.layout(doc_of(SPANS, DEVICES))
    assert [(lane.name, lane.kind) for lane in lanes] == [
        ("node0/dev0", "device"),
        ("node0/dev1", "device"),
        # processes with no device of their own, by default: the driver (its launch spans
        # name components that hold devices, but it holds none) and a CPU reward worker
        ("driver", "process"),
        ("reward[0]", "process"),
    ]
    dev0 = lanes[0]
    assert dev0.tracks == 2 and dev0.busy_fraction == pytest.approx(7 / 8)
    blocks = {(b.name, b.start_s, b.dur_s, b.track, b.kind) for b in dev0.blocks}
    assert blocks == {
        ("generate", 1.0, 4.0, 0, "compute"),
        ("train", 4.0, 3.0, 1, "compute"),
        ("offload", 7.0, 1.0, 0, "memory"),  # back on the first free row
    }
    driver = lanes[2]
    assert driver.tracks == 3  # the three launches overlap
    assert {b.component for b in driver.blocks} == {"actor", "rollout", "reward", "driver"}
    assert lanes[1].blocks == () and lanes[1].tracks == 1 and lanes[1].busy_fraction == 0


def test_layout_process_choices():
    doc = doc_of(SPANS, DEVICES)
    assert [lane.name for lane in render.layout(doc, "none")] == DEVICES
    assert [lane.name for lane in render.layout(doc, "all")][2:] == [
        "actor[0]",
        "driver",
        "reward[0]",
        "rollout[0]",
    ]
    with pytest.raises(ConfigError, match="processes='some'"):
        render.layout(doc, "some")


def _hex_rgb(color: str) -> tuple[float, float, float]:
    return tuple(int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))


def _pixels_of(png, color: str) -> int:
    import numpy as np

    img = png[..., :3]
    return int((np.abs(img - np.array(_hex_rgb(color))).max(axis=-1) < 0.02).sum())


def test_png_shows_each_component_in_its_colour(tmp_path):
    from matplotlib.image import imread

    out = render.render(doc_of(SPANS, DEVICES), tmp_path / "t.png", title="toy")
    png = imread(out)
    assert png.shape[1] == 1200 and png.shape[0] > 150  # 12 in at 100 dpi
    for component in ("rollout", "actor", "reward"):
        assert _pixels_of(png, render.COMPONENT_COLORS[component]) > 500, component
    assert _pixels_of(png, render.COMPONENT_COLORS["critic"]) == 0  # no critic in this run

    only_actor = [s for s in SPANS if s.component == "actor"]
    png = imread(render.render(doc_of(only_actor, DEVICES), tmp_path / "a.png"))
    assert _pixels_of(png, render.COMPONENT_COLORS["rollout"]) == 0


def test_unknown_components_get_distinct_colours():
    others = ["zeta", "alpha", "actor"]
    assert render.component_color("actor", others) == render.COMPONENT_COLORS["actor"]
    assert render.component_color("alpha", others) != render.component_color("zeta", others)


def test_cli_renders_a_run_dir_and_refuses_a_missing_trace(tmp_path):
    timeline.write_run_timeline(tmp_path, SPANS, DEVICES)
    out = subprocess.run(
        [sys.executable, "-m", "rltrain.telemetry.draw", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / timeline.TRACE_PNG).stat().st_size > 1000
    assert "node0/dev1" in out.stdout and "87.5%" in out.stdout  # dev0 busy 7 of 8 s

    assert render.main([str(tmp_path / "empty")]) == 2


def test_the_table_states_its_window_beside_the_summarys():
    # 10 s of worker start-up, then 2 s in which the device works 1.8 s
    spans = [
        sp("launch", "actor", [], "driver", 0, 10),
        sp("train", "actor", ["node0/dev0"], "actor[0]", 10, 1.8),
        sp("step", "driver", [], "driver", 10, 2),
    ]
    doc = doc_of(spans, ["node0/dev0"])
    note = render.window_note(doc)
    assert "the whole trace, 12.000 s (worker start-up included)" in note
    assert "from the end of worker start-up: 2.000 s" in note
    assert "busy 90% on average (utilization.busy_fraction_mean 0.900)" in note
    summary = timeline.summarize(spans, ["node0/dev0"], window_us=timeline.training_window(spans))
    assert timeline.headline(summary)["busy_fraction_mean"] == pytest.approx(0.9)


def test_cli_refuses_an_out_suffix_it_cannot_draw_before_printing(tmp_path, capsys):
    timeline.write_run_timeline(tmp_path, SPANS, DEVICES)
    assert render.main([str(tmp_path), "--out", str(tmp_path / "t.txt")]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # refused before the table
    assert "--out" in err and "'.txt'" in err and ".png" in err
    assert not (tmp_path / "t.txt").exists()


def test_cli_prints_the_path_it_wrote_for_an_out_without_suffix(tmp_path, capsys):
    timeline.write_run_timeline(tmp_path, SPANS, DEVICES)
    assert render.main([str(tmp_path), "--out", str(tmp_path / "pics" / "noext")]) == 0
    written = tmp_path / "pics" / "noext.png"
    assert written.stat().st_size > 1000
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {written}"


def test_cli_points_a_predicted_dir_without_a_plan_trace_to_mode_plan(tmp_path, capsys):
    timeline.write_run_timeline(tmp_path / "run", SPANS, DEVICES)
    (tmp_path / "plan").mkdir()
    assert render.main([str(tmp_path / "run"), "--predicted", str(tmp_path / "plan")]) == 2
    err = capsys.readouterr().err
    assert "plan_trace.json" in err and "mode=plan" in err and "logging.trace" not in err
