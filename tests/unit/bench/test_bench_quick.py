"""Every registered benchmark measure runs in --quick mode, and the harness's arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rltrain.bench import harness
from rltrain.bench.harness import Case, Measure, Suite

#: Measures whose quick mode starts one local Ray of the default shape (one node, 2 simulated
#: devices of the default memory, the machine's cores) and nothing else that depends on it: they
#: join one such Ray (``--address``, :func:`shared_ray`) instead of each starting and stopping
#: its own (seconds of waiting and Ray's processes each). Each still runs in a process of its own
#: (a Ray job: its actors and placement groups end with it). They run together on one test
#: process (one unit, ``spread(unit=...)``), so one Ray serves them and stops after them. The
#: others start no Ray, or a Ray whose start they time (``startup``), or a Ray of another shape
#: (``framework_share*``: 1 device; ``weight_sync``: a 2 GiB device per receiver), or read the
#: processes under their driver (``soak``: Ray's own processes are in its figures).
SHARED_RAY = frozenset(
    {
        "agent_faults",
        "async_rollout",
        "auto_placement",
        "channel_16mb",
        "channel_1kb",
        "channel_1mb",
        "channel_64mb",
        "embodied_pipeline",
        "long_tail",
        "partial_rollout",
        "runtime_call",
        "runtime_startup",
        "time_to_accuracy",
    }
)
#: The shared Ray's devices: what those measures' ``Cluster.start`` asks for.
SHARED_DEVICES = 2
#: Ray's switch between its host address and loopback: the local Ray rltrain starts listens on
#: 127.0.0.1 only (``rltrain.scheduler.cluster``), so a process joining it must look there too.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

#: The helper process: the local Ray a measure would start (``Cluster.start``), its address on
#: stdout, stopped when stdin closes.
_HEAD = """
import sys
import ray
from rltrain.scheduler import Cluster
cluster = Cluster.start({"devices_per_node": int(sys.argv[1]), "startup_timeout_s": 120})
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


@pytest.fixture(scope="module")
def shared_ray():
    """The address of a local Ray of the measures' shape, started by a helper process."""
    head = subprocess.Popen(
        [sys.executable, "-c", _HEAD, str(SHARED_DEVICES)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        address = head.stdout.readline().strip()  # once Ray is up (empty: the helper died)
        assert address, f"the shared Ray did not start (exit {head.wait(timeout=60)})"
        yield address
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            head.kill()


def _marked(name: str):
    # spread: each measure in a process of its own, so either test process may start it
    mark = pytest.mark.spread(unit="bench-measures-on-one-ray") if name in SHARED_RAY else None
    return pytest.param(name, marks=mark or pytest.mark.spread)


@pytest.mark.parametrize("name", [_marked(n) for n in sorted(harness.discover())])
def test_measure_runs_quick(name, tmp_path, request):
    cmd = [sys.executable, "-m", "rltrain.bench", name, "--quick", "--out", str(tmp_path)]
    env = dict(os.environ)
    if name in SHARED_RAY:
        cmd += ["--address", request.getfixturevalue("shared_ray")]
        env[LOOPBACK_ENV] = "0"  # the shared Ray listens on loopback only, as a local one does
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    (result,) = data["measures"]
    assert result["name"] == name and result["quick"] is True
    assert all(c["median"] > 0 for c in result["cases"])
    assert f"`{name}`" in (tmp_path / "results.md").read_text()


def test_shared_ray_measures_are_registered():
    """A renamed or removed measure leaves no stale entry (it would silently lose its Ray)."""
    assert set(SHARED_RAY) <= set(harness.discover())


def test_unknown_measure_is_refused(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "rltrain.bench", "no_such_measure", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "no_such_measure" in out.stderr


class FakeClock:
    """Each call to fn advances time by the next scripted duration."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 0.0
        self.durations = durations

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.durations.pop(0)


def test_median_spread_ratio_and_scaling_by_hand():
    # warm-up calls are untimed; then 3 timed calls per case
    clock = FakeClock([0, 1.0, 3.0, 2.0, 0, 4.0, 8.0, 6.0])
    suite = Suite(
        cases=(Case("n=1", clock.step, size=1), Case("n=2", clock.step, size=2)),
        baseline="n=1",
        warmup=1,
        repeats=3,
    )
    r = harness.run_measure(Measure("toy", "a toy", lambda quick: suite), clock=clock)
    base, big = r.cases
    assert base.samples == (1.0, 3.0, 2.0) and base.median == 2.0
    assert (base.min, base.max, base.iqr) == (1.0, 3.0, 1.0)  # quartiles 1.5 and 2.5
    assert big.median == 6.0 and big.ratio == 3.0
    assert big.per_size_ratio == 1.5  # (6 / 2) / (2 / 1)
    assert r.scaling_exponent == pytest.approx(1.5849625, rel=1e-6)  # log2(3)


def test_scaling_exponent_of_linear_data_is_one():
    assert harness.scaling_exponent([(8, 0.1), (16, 0.2), (1024, 12.8)]) == pytest.approx(1.0)
    assert harness.scaling_exponent([(8, 0.1)]) is None


def test_bad_baseline_is_refused():
    suite = Suite(cases=(Case("a", lambda: None),), baseline="b")
    with pytest.raises(ValueError, match="baseline 'b'"):
        harness.run_measure(Measure("toy", "", lambda quick: suite))


def test_update_doc_replaces_only_its_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro\n\n<!-- bench:other -->\nkeep\n<!-- /bench:other -->\n")
    r = harness.MeasureResult("toy", "d", "a", True, (), None)
    harness.update_doc([r], str(doc))
    harness.update_doc([r], str(doc))  # idempotent: replaced, not appended twice
    text = doc.read_text()
    assert text.count("<!-- bench:toy -->") == 1 and "keep" in text and "intro" in text


def test_results_read_back_equal_what_was_written():
    """``python -m rltrain.bench a b`` runs each measure in its own process and reads the
    results back: the round trip through ``results.json`` keeps every field."""
    clock = FakeClock([0, 1.0, 3.0, 2.0])
    suite = Suite(cases=(Case("n=1", clock.step, size=1),), baseline="n=1", warmup=1, repeats=3)
    r = harness.run_measure(Measure("toy", "a toy", lambda quick: suite), clock=clock)
    assert harness.result_from_dict(json.loads(json.dumps(r.to_dict()))) == r
