"""Every registered benchmark measure runs in --quick mode, and the harness's arithmetic."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterable

import pytest

from rltrain.bench import harness
from rltrain.bench.harness import Case, Measure, Suite

#: Measures whose quick mode starts one local Ray and nothing else that depends on it, by the
#: shape they start (``Cluster.start``'s config): each group runs in ONE bench process
#: (``python -m rltrain.bench a b ... --quick --address A``, the bench's own in-process path) on
#: one Ray of that shape (:data:`ON_SESSION_RAY`: the test session's; else one that a helper
#: process starts), instead of an interpreter, an import of torch and transformers and a Ray
#: start and stop per measure. A group's tests form one unit
#: (``spread(unit=NAME)``: one test process); the first to run starts the group's bench run,
#: and each test checks its own measure's result and shows its own part of the output. Measures
#: that start no Ray join a group too (only the process is shared). The others run in a
#: process of their own: they start a Ray whose start they time (``startup``), or read the
#: processes under their driver (``soak``: Ray's own processes are in its figures), or change
#: often (``agent_rollout``, being reworked).
SHARED = {
    # the default shape: one node, 2 simulated devices of the default memory, the machine's cores
    "bench-measures-on-one-ray": (
        {"devices_per_node": 2},
        frozenset(
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
        ),
    ),
    # _latency_run: cluster.devices_per_node=1; with them the quick modes that start no Ray
    # (they only share the process: one interpreter and one import of torch for all)
    "bench-measures-on-one-device": (
        {"devices_per_node": 1},
        frozenset(
            {
                "framework_share",
                "framework_share_turns",
                "dynamic_batching",
                "long_generation",
                "offload",
                "plain_grpo",
                "plan_scale",
                "whatif",
            }
        ),
    ),
    # a 2 GiB device for the sender and each receiver: weight_sync --quick asks for 3,
    # weight_sync_step for 4 (its receivers take the devices after the sender's either way)
    "bench-measures-on-2gib-devices": (
        {"devices_per_node": 4, "device_memory_gib": 2.0},
        frozenset({"weight_sync", "weight_sync_step"}),
    ),
}
#: The unit whose shape is the test session's own Ray (``tests/session_ray.py``: one node, 2
#: simulated devices of the default 4 GiB, the machine's cores): it runs on that Ray (a second
#: driver, as a user's bench run joins a cluster with ``--address``) instead of a helper's, so the
#: test process starts one Ray for this unit and its later integration tests, not two.
ON_SESSION_RAY = "bench-measures-on-one-ray"
#: Measure name -> its shared unit.
UNIT_OF = {name: unit for unit, (_, names) in SHARED.items() for name in names}
SHARED_RAY = frozenset(UNIT_OF)
#: Ray's switch between its host address and loopback: the local Ray rltrain starts listens on
#: 127.0.0.1 only (``rltrain.scheduler.cluster``), so a process joining it must look there too.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: A test's wait for its unit's bench run: the first test's set-up runs every measure of the
#: unit (on a loaded 2-core machine past the suite's 600 s per test).
SHARED_TIMEOUT_S = 1800

#: The module of the measures that keep one reservation of the node's cores for every measure
#: of theirs until their process ends (``runtime._STATE``): in a shared run they go last, or
#: the next measure's job would wait for those cores forever.
HOLDS_CORES_TO_EXIT = "rltrain.bench.measures.runtime"


def bench_order(names: Iterable[str]) -> list[str]:
    """``names`` in the order one bench process runs them: by name, the measures of one
    ``share`` together (their quick modes then share one job: ``Measure.share``), the measures
    of :data:`HOLDS_CORES_TO_EXIT` last."""
    registry = harness.discover()
    return sorted(
        names,
        key=lambda n: (
            registry[n].build.__module__ == HOLDS_CORES_TO_EXIT,
            registry[n].share or n,
            n,
        ),
    )


#: The helper process: the local Ray a measure would start (``Cluster.start``), its address on
#: stdout, stopped when stdin closes.
_HEAD = """
import json, sys
import ray
from rltrain.scheduler import Cluster
cluster = Cluster.start({**json.loads(sys.argv[1]), "startup_timeout_s": 120})
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


def _bench_on(
    address: str, names: Iterable[str], out_dir: pathlib.Path
) -> subprocess.CompletedProcess[str]:
    """One bench process running ``names`` in quick mode on the Ray at ``address``."""
    cmd = [sys.executable, "-m", "rltrain.bench", *bench_order(names), "--quick"]
    cmd += ["--out", str(out_dir), "--address", address]
    # the shared Ray listens on loopback only, as a local one does; unbuffered: in order
    env = dict(os.environ, **{LOOPBACK_ENV: "0", "PYTHONUNBUFFERED": "1"})
    return subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        timeout=SHARED_TIMEOUT_S - 120,
    )


def run_on_shared_ray(
    unit: str, out_dir: pathlib.Path, address: str | None = None
) -> tuple[int, str, dict, str]:
    """Run ``unit``'s measures in one bench process on the Ray at ``address``, or else on a Ray
    of the unit's shape that a helper process starts and stops. A measure that fails is reported
    by the bench and the others still run.

    Returns:
        ``(exit code, combined output, results.json's measures by name, results.md)``.
    """
    shape, names = SHARED[unit]
    if address is not None:
        out = _bench_on(address, names, out_dir)
    else:
        head = subprocess.Popen(
            [sys.executable, "-c", _HEAD, json.dumps(shape)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            address = head.stdout.readline().strip()  # once Ray is up (empty: the helper died)
            assert address, f"the shared Ray did not start (exit {head.wait(timeout=60)})"
            out = _bench_on(address, names, out_dir)
        finally:
            head.stdin.close()
            try:
                head.wait(timeout=120)
            except subprocess.TimeoutExpired:
                head.kill()
    results = out_dir / "results.json"
    measures = json.loads(results.read_text())["measures"] if results.exists() else []
    md = (out_dir / "results.md").read_text() if results.exists() else ""
    return out.returncode, out.stdout, {m["name"]: m for m in measures}, md


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory, request):
    """Each shared unit's bench run, made by the first of its tests to ask."""
    done: dict[str, tuple[int, str, dict, str]] = {}

    def get(unit: str) -> tuple[int, str, dict, str]:
        if unit not in done:
            address = None
            if unit == ON_SESSION_RAY:
                import ray

                request.getfixturevalue("ray_session").ensure()
                address = ray.get_runtime_context().gcs_address
            done[unit] = run_on_shared_ray(unit, tmp_path_factory.mktemp(unit), address)
        return done[unit]

    return get


def measure_output(output: str, name: str) -> str:
    """The part of a bench run's output from ``name``'s start to the next measure's (the bench
    prints ``running NAME ...`` before each)."""
    start = output.find(f"running {name} ")
    if start < 0:
        return output  # it never started: the whole output says why
    nxt = output.find("\nrunning ", start + 1)
    return output[start : nxt if nxt >= 0 else len(output)]


def _marked(name: str):
    if name in UNIT_OF:
        unit = pytest.mark.spread(unit=UNIT_OF[name])
        return pytest.param(name, marks=(unit, pytest.mark.timeout(SHARED_TIMEOUT_S)))
    # spread: a measure in a process of its own, so either test process may start it
    return pytest.param(name, marks=pytest.mark.spread)


def _check(result: dict, name: str, md: str) -> None:
    assert result["name"] == name and result["quick"] is True
    assert all(c["median"] > 0 for c in result["cases"])
    assert f"`{name}`" in md


@pytest.mark.parametrize("name", [_marked(n) for n in sorted(harness.discover())])
def test_measure_runs_quick(name, tmp_path, request):
    if name in UNIT_OF:
        code, output, results, md = request.getfixturevalue("shared_runs")(UNIT_OF[name])
        own = measure_output(output, name)
        failed = [
            ln[len("failed: ") :].split(", ")
            for ln in output.splitlines()
            if ln.startswith("failed: ")
        ]
        assert name in results and not any(name in names for names in failed), own
        assert code in (0, 1), output  # 1: another measure failed (its own test says which)
        _check(results[name], name, md)
        return
    cmd = [sys.executable, "-m", "rltrain.bench", name, "--quick", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (result,) = json.loads((tmp_path / "results.json").read_text())["measures"]
    _check(result, name, (tmp_path / "results.md").read_text())


def test_shared_ray_measures_are_registered():
    """A renamed or removed measure leaves no stale entry (it would silently lose its Ray), and
    no measure is in two units."""
    assert set(SHARED_RAY) <= set(harness.discover())
    assert sum(len(names) for _, names in SHARED.values()) == len(SHARED_RAY)


def test_the_unit_on_the_session_ray_has_that_rays_shape():
    """The unit run on the test session's Ray asks for the shape that Ray has: its devices, the
    default device memory, the machine's cores, one node."""
    from session_ray import SESSION_CLUSTER

    from rltrain.config.engine_checks import simulated_device_gib

    assert SHARED[ON_SESSION_RAY][0] == {"devices_per_node": SESSION_CLUSTER["devices_per_node"]}
    assert SESSION_CLUSTER["device_memory_gib"] == simulated_device_gib(None)
    assert SESSION_CLUSTER["num_nodes"] == 1
    assert SESSION_CLUSTER["cpus_per_node"] == (os.cpu_count() or 2)


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


def test_a_sections_heading_names_the_date_and_the_machine():
    r = harness.MeasureResult("toy", "d", "a", True, (), None, date="2026-11-28", machine="m1")
    assert "### `toy` (2026-11-28, m1, quick)" in harness.markdown([r])
    assert harness.MeasureResult("toy", "d", "a", False, ()).machine == harness.machine_label()
    label = harness.machine_label()
    assert label.startswith(f"{os.cpu_count()} CPUs, ") and ("GPU" in label or " x " in label)
    # a result written before headings named the machine reads back with none, not this one
    old = {k: v for k, v in r.to_dict().items() if k != "machine"}
    assert harness.result_from_dict(old).machine == ""


def test_startup_refuses_a_cluster_to_join(monkeypatch):
    from rltrain.bench.measures.startup import startup_measure
    from rltrain.errors import ConfigError

    monkeypatch.setenv(harness.ADDRESS_ENV, "10.0.0.1:6379")
    with pytest.raises(ConfigError, match="without --address or cluster=ray"):
        startup_measure(quick=True)
