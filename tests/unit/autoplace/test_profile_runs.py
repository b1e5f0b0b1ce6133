"""The profiling runs without Ray: an injected entry writes what a run records (or fails), the
time limit is kept with a hand-driven clock, and a profile cut short never replaces a complete
one in the cache."""

from __future__ import annotations

import json
import os

import pytest

from rltrain.autoplace.choose import origin
from rltrain.autoplace.cost import ReasoningCosts, Scaling
from rltrain.autoplace.fit import profile_candidates
from rltrain.autoplace.profile import (
    Measured,
    Profile,
    load_cached,
    profile_layouts,
    reusable_cached,
    save_cached,
    store,
)
from rltrain.autoplace.settings import AutoSettings
from rltrain.bench.measures.trainer import compose
from rltrain.errors import WorkerError

FUSED = "collocated 0-1 fused"
SPLIT = "disaggregated actor 0 rollout 1"
HYBRID = "hybrid actor 0-1 rollout 1"


@pytest.fixture(scope="module")
def run():
    return compose("placement=auto")  # 2 devices: slots [fused], [split, hybrid]


def _write_steps(run_dir: str, steps: int, seconds: float = 1.0) -> None:
    """What a turn-taking run records: ``metrics.jsonl`` and the driver's step spans."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for i in range(steps):
            record = {"time/generate_s": 0.6 * seconds, "time/train_s": 0.4 * seconds}
            f.write(json.dumps({"step": i, **record, "time/step_s": seconds}) + "\n")
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "process driver"}}]
    events += [
        {"ph": "X", "name": "generate", "cat": "driver", "pid": 1, "ts": i * 1e6, "dur": 1e5}
        for i in range(steps)
    ]
    with open(os.path.join(run_dir, "trace.json"), "w") as f:
        json.dump({"traceEvents": events}, f)


class Entry:
    """A runner entry: ``fail`` layouts raise, ``short`` ones stop after one step, each run
    advances the clock by ``run_s``."""

    def __init__(self, fail=(), short=(), run_s: float = 1.0) -> None:
        self.fail, self.short, self.run_s = set(fail), set(short), run_s
        self.now, self.ran, self.budgets = 0.0, [], []

    def clock(self) -> float:
        return self.now

    def __call__(self, prun, run_dir: str) -> dict:
        name = os.path.basename(run_dir)
        self.ran.append(name)
        self.budgets.append(prun.trainer.time_budget_s)
        self.now += self.run_s
        if name in self.fail:
            raise WorkerError("group 'actor' rank 0 'train' failed: boom\nTraceback (most ...")
        _write_steps(run_dir, 1 if name in self.short else prun.trainer.total_steps)
        return {}


def _dir(name: str) -> str:
    return name.replace(" ", "_")


def test_a_failed_layout_is_reported_and_its_slot_falls_back(run, tmp_path):
    entry = Entry(fail={_dir(SPLIT)})
    settings = AutoSettings(profile_steps=4)
    slots = profile_candidates("reasoning", 2)
    made = profile_layouts(run, settings, str(tmp_path), slots, entry, entry.clock)
    assert entry.ran == [_dir(FUSED), _dir(SPLIT), _dir(HYBRID)]
    assert [c.name for c, _ in made.runs] == [FUSED, HYBRID]  # the fused reading is kept
    assert made.failed == (f"{SPLIT}: WorkerError: group 'actor' rank 0 'train' failed: boom",)
    assert made.skipped == ()
    assert made.runs[1][1].steps == 2  # 4 steps: warm-up and the last left out


def test_every_layout_of_a_slot_failing_leaves_the_other_slots(run, tmp_path):
    entry = Entry(fail={_dir(SPLIT), _dir(HYBRID)})
    slots = profile_candidates("reasoning", 2)
    made = profile_layouts(
        run, AutoSettings(profile_steps=3), str(tmp_path), slots, entry, entry.clock
    )
    assert [c.name for c, _ in made.runs] == [FUSED]
    assert [f.split(":")[0] for f in made.failed] == [SPLIT, HYBRID]


def test_the_time_limit_skips_the_runs_after_it(run, tmp_path):
    entry = Entry(run_s=4.0)
    settings = AutoSettings(profile_steps=3, time_limit_s=3.0)
    slots = profile_candidates("reasoning", 2)
    made = profile_layouts(run, settings, str(tmp_path), slots, entry, entry.clock)
    # the first run gets what is left (3 s) and takes 4: nothing else starts, no fall-back
    assert entry.ran == [_dir(FUSED)] and entry.budgets == [3.0]
    assert [c.name for c, _ in made.runs] == [FUSED] and made.skipped == (SPLIT,)


def test_a_run_stopped_within_its_warmup_counts_as_skipped(run, tmp_path):
    entry = Entry(short={_dir(SPLIT)})
    slots = profile_candidates("reasoning", 2)
    made = profile_layouts(
        run, AutoSettings(profile_steps=3), str(tmp_path), slots, entry, entry.clock
    )
    assert [c.name for c, _ in made.runs] == [FUSED]
    assert made.skipped == (f"{SPLIT} (stopped within its warm-up step)",)
    assert made.failed == () and entry.ran == [_dir(FUSED), _dir(SPLIT)]


def test_no_layout_measured_names_each_failure_and_the_limit():
    made = Measured((), skipped=("b",), failed=("a: WorkerError: boom",))
    why = made.why_none(AutoSettings(time_limit_s=7.0))
    assert why == (
        "failed: a: WorkerError: boom; cut short by placement.auto.time_limit_s=7.0: b; raise it"
    )


COSTS = ReasoningCosts(generate=Scaling(1.0), train=Scaling(0.5), sync=0.01)


def _profile(skipped=(), failed=()) -> Profile:
    runs = ({"layout": FUSED},) if skipped else ({"layout": FUSED}, {"layout": SPLIT})
    return Profile("k", "reasoning", COSTS, runs, skipped=skipped, failed=failed)


def test_a_profile_cut_short_is_not_cached_over_a_complete_one(tmp_path):
    settings = AutoSettings(cache_dir=str(tmp_path))
    complete = store(settings, _profile())
    assert complete.path and reusable_cached(settings, "k").runs == complete.runs
    partial = store(settings, _profile(skipped=(SPLIT,)))
    assert partial.path == "" and not partial.complete
    assert load_cached(settings, "k").complete  # the complete one stays
    assert "not cached" in origin(partial)


def test_a_cached_profile_cut_short_is_measured_again(tmp_path):
    settings = AutoSettings(cache_dir=str(tmp_path))
    save_cached(settings, _profile(skipped=(SPLIT,)))
    assert load_cached(settings, "k").skipped == (SPLIT,)
    assert reusable_cached(settings, "k") is None  # get_profile measures again
    # a complete measurement replaces it; a partial one replaces a partial one
    assert store(settings, _profile(skipped=(HYBRID,))).path
    assert store(settings, _profile()).path and reusable_cached(settings, "k").complete


def test_the_ranking_header_says_what_was_left_out(tmp_path):
    p = _profile(skipped=(SPLIT,), failed=(f"{HYBRID}: WorkerError: boom",))
    back = Profile.from_dict(p.to_dict())
    assert back.skipped == (SPLIT,) and back.failed == p.failed
    assert back.gaps() == [
        f"  skipped at placement.auto.time_limit_s (raise it to measure them): {SPLIT}",
        f"  failed: {HYBRID}: WorkerError: boom",
    ]
    assert _profile().gaps() == []
