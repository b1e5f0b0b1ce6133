"""``rltrain bench`` / ``rltrain trace`` dispatch, the bench's cluster options, per-case counts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rltrain.__main__ import SUBCOMMANDS, subcommand
from rltrain.bench import harness
from rltrain.bench.__main__ import _run
from rltrain.bench.harness import ADDRESS_ENV, Case, Measure, Suite, cluster_address
from rltrain.errors import ConfigError
from rltrain.telemetry import timeline
from rltrain.telemetry.trace import Span


def console(*args: str) -> subprocess.CompletedProcess[str]:
    """What the ``rltrain`` console script runs (``rltrain.__main__:main``) with ``args``."""
    code = "import sys; from rltrain.__main__ import main; sys.argv[:] = sys.argv[1:]; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "rltrain", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


# --------------------------------------------------------------------------------- dispatch
@pytest.mark.parametrize(
    "argv",
    [[], ["placement=hybrid"], ["-m", "placement=a,b"], ["--cfg", "job"], ["+bench=1"], ["Bench"]],
)
def test_hydra_command_lines_are_not_subcommands(argv):
    assert subcommand(argv) is None


def test_subcommands_name_modules_with_a_main():
    assert set(SUBCOMMANDS) == {"bench", "trace"}
    assert callable(subcommand(["bench", "--list"]))


def test_rltrain_bench_lists_the_measures_through_both_entries():
    for out in (
        subprocess.run(
            [sys.executable, "-m", "rltrain", "bench", "--list"],
            capture_output=True,
            text=True,
            timeout=60,
        ),
        console("bench", "--list"),
    ):
        assert out.returncode == 0, out.stderr
        listed = [line.split(":", 1)[0] for line in out.stdout.splitlines()]
        assert listed == sorted(harness.discover())


def test_rltrain_bench_refuses_a_bad_cluster_naming_it(capsys):
    command = subcommand(["bench", "plan_scale", "cluster=moon"])
    assert command is not None and command() == 2
    err = capsys.readouterr().err
    assert "bench: error: cluster='moon' is not valid: choose cluster=local" in err


def test_rltrain_trace_renders_a_run_dir(tmp_path):
    spans = [Span("train", "actor", ("node0/dev0",), "actor[0]", 0.0, 3e6, 1)]
    timeline.write_run_timeline(tmp_path, spans, ["node0/dev0", "node0/dev1"])
    out = console("trace", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / timeline.TRACE_PNG).read_bytes()[:4] == b"\x89PNG"
    assert "node0/dev1" in out.stdout  # the idle device has its lane
    command = subcommand(["trace", str(tmp_path / "nothing")])
    assert command is not None and command() == 2  # trace's own refusal, not Hydra's


# ---------------------------------------------------------------------------- cluster options
@pytest.mark.parametrize(
    ("args", "address", "env", "expected"),
    [
        (["plan_scale"], None, {}, (["plan_scale"], None)),
        (["plan_scale", "cluster=local"], None, {ADDRESS_ENV: "auto"}, (["plan_scale"], None)),
        (["cluster=ray", "offload"], None, {}, (["offload"], "auto")),
        (["cluster.address=10.0.0.1:6379"], None, {}, ([], "10.0.0.1:6379")),
        ([], "10.0.0.1:6379", {}, ([], "10.0.0.1:6379")),
        (["cluster=ray"], "auto", {}, ([], "auto")),  # the same cluster twice is fine
        (["a", "b"], None, {ADDRESS_ENV: "h:1"}, (["a", "b"], "h:1")),  # from the environment
        ([], "", {ADDRESS_ENV: "h:1"}, ([], None)),  # --address "" forces the embedded default
    ],
)
def test_cluster_address_by_hand(args, address, env, expected):
    assert cluster_address(args, address, env) == expected


@pytest.mark.parametrize(
    ("args", "address", "match"),
    [
        (["cluster=moon"], None, r"cluster='moon' is not valid: choose cluster=local"),
        (["trainer.total_steps=3"], None, r"'trainer.total_steps=3' is not a bench option"),
        (["cluster=ray"], "10.0.0.1:6379", r"--address and cluster=ray name different clusters"),
        (["cluster=local", "cluster=ray"], None, r"cluster=local and cluster=ray"),
    ],
)
def test_cluster_address_refusals_name_the_argument(args, address, match):
    with pytest.raises(ConfigError, match=match):
        cluster_address(args, address, {})


# ------------------------------------------------------------- per-case counts, extras, failures
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def step(self, dt: float) -> None:
        self.calls += 1
        self.now += dt


def test_a_case_may_ask_for_its_own_warmup_and_repeats():
    clock = FakeClock()
    calls = {"short": 0, "long": 0}

    def short() -> None:
        calls["short"] += 1
        clock.step(1.0)

    def long() -> None:
        calls["long"] += 1
        clock.step(10.0 * calls["long"])  # 10, 20, ...: one timed call after no warm-up

    suite = Suite(
        cases=(Case("short", short), Case("long", long, warmup=0, repeats=1)),
        baseline="short",
        warmup=2,
        repeats=4,
        extras=lambda: {"predicted_s": 9.5, "count": 3},
    )
    r = harness.run_measure(Measure("toy", "", lambda quick: suite), clock=clock)
    assert calls == {"short": 6, "long": 1}
    short_r, long_r = r.cases
    assert (len(short_r.samples), short_r.warmup) == (4, 2)
    assert (long_r.samples, long_r.warmup, long_r.ratio) == ((10.0,), 0, 10.0)
    assert r.extras == {"predicted_s": 9.5, "count": 3.0}
    table = harness.markdown([r])
    assert "| short (baseline) | 4 +2 | 1 |" in table and "| long | 1 | 10 |" in table
    assert "predicted_s = 9.5; count = 3" in table


def test_quick_mode_caps_each_case():
    suite = Suite(cases=(), baseline="", warmup=3, repeats=9)
    assert harness.counts(Case("a", print), suite, quick=True) == (1, 1)
    assert harness.counts(Case("a", print, warmup=0, repeats=1), suite, quick=True) == (0, 1)
    assert harness.counts(Case("a", print, repeats=0), suite, quick=False) == (3, 1)


def test_a_failing_measure_is_reported_and_the_others_still_run(capsys):
    def boom(quick: bool) -> Suite:
        raise RuntimeError("no cluster")

    ok = Suite(cases=(Case("a", lambda: None),), baseline="a", warmup=0, repeats=1)
    registry = {"bad": Measure("bad", "", boom), "ok": Measure("ok", "", lambda quick: ok)}
    results, failed = _run(registry, ["bad", "ok"], quick=True)
    assert [r.name for r in results] == ["ok"] and failed == ["bad"]
    out = capsys.readouterr()
    assert "RuntimeError: no cluster" in out.err and "### `ok`" in out.out


def test_measures_of_one_share_run_next_to_each_other_keep_one_resource(capsys):
    """The runner keeps a shared resource while the next measure has the same ``share`` and
    closes it before any other measure runs (it could hold what that one needs)."""
    events: list[str] = []

    def using(name: str):
        def build(quick: bool) -> Suite:
            def make():
                events.append("make")
                return name, lambda: events.append("close")

            got = harness.shared("toy-share", make)
            events.append(f"{name} got {got}")
            return Suite(cases=(Case("a", lambda: None),), baseline="a", warmup=0, repeats=1)

        return build

    def alone(quick: bool) -> Suite:
        events.append("alone")
        return Suite(cases=(Case("a", lambda: None),), baseline="a", warmup=0, repeats=1)

    registry = {
        "s1": Measure("s1", "", using("s1"), share="toy-share"),
        "s2": Measure("s2", "", using("s2"), share="toy-share"),
        "other": Measure("other", "", alone),
    }
    results, failed = _run(registry, ["s1", "s2", "other", "s1"], quick=True)
    assert not failed and [r.name for r in results] == ["s1", "s2", "other", "s1"]
    assert events == [
        *("make", "s1 got s1", "s2 got s1", "close"),  # one resource for both, closed after s2
        "alone",
        *("make", "s1 got s1", "close"),  # made again, closed at the end
    ]


@pytest.mark.parametrize("where", ["missing/benchmarks.md", "."])
def test_a_bad_update_docs_path_is_refused_before_any_measure(tmp_path, capsys, monkeypatch, where):
    from rltrain.bench import __main__ as bench_main

    ran: list[str] = []
    monkeypatch.setattr(bench_main, "_run", lambda reg, names, quick: ran.extend(names))
    monkeypatch.setattr(bench_main, "_run_apart", lambda names, quick: ran.extend(names))
    path = str(tmp_path / where)
    argv = ["plan_scale", "--out", str(tmp_path / "out"), "--update-docs", path]
    assert bench_main.main(argv) == 2
    assert ran == []  # refused before the measures
    err = capsys.readouterr().err
    assert f"--update-docs {path}" in err
    assert ("does not exist" if where != "." else "is a directory") in err
    assert not (tmp_path / "out").exists()


def test_update_docs_accepts_a_new_file_in_an_existing_directory(tmp_path):
    from rltrain.bench.__main__ import check_docs_path

    check_docs_path(str(tmp_path / "new.md"))  # created when the results are written
    check_docs_path(None)
