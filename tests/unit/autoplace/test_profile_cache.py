"""Profiles are cached by model, task, cluster and stage-time settings, never by placement."""

from __future__ import annotations

import dataclasses
import json

from rltrain.autoplace.candidates import Candidate
from rltrain.autoplace.cost import ReasoningCosts, Scaling
from rltrain.autoplace.profile import (
    Profile,
    cache_file,
    get_profile,
    load_cached,
    profile_key,
    profile_run_config,
    save_cached,
)
from rltrain.autoplace.settings import AutoSettings
from rltrain.config.schema import RunConfig


def _run(**sections):
    run = RunConfig()
    run = dataclasses.replace(
        run,
        placement=dataclasses.replace(
            run.placement, component_placement={"actor": "all", "rollout": "all"}
        ),
    )
    return dataclasses.replace(run, **sections)


def test_key_changes_with_timing_settings_not_with_placement():
    run = _run()
    key = profile_key(run)
    assert key.startswith("reasoning-llama-h64-arithmetic-1x2-")
    assert profile_key(_run()) == key  # stable
    other_layout = dataclasses.replace(
        run,
        placement=dataclasses.replace(
            run.placement, component_placement={"actor": "0", "rollout": "1"}, fuse="true"
        ),
        trainer=dataclasses.replace(run.trainer, max_staleness=1, total_steps=7),
    )
    assert profile_key(other_layout) == key
    slower = dataclasses.replace(
        run, simulate=dataclasses.replace(run.simulate, rollout_latency_ms=5.0)
    )
    bigger = dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, devices_per_node=8))
    batch = dataclasses.replace(run, trainer=dataclasses.replace(run.trainer, train_batch_size=4))
    assert len({key, profile_key(slower), profile_key(bigger), profile_key(batch)}) == 4
    assert "-1x8-" in profile_key(bigger)


def _profile(key: str) -> Profile:
    costs = ReasoningCosts(generate=Scaling(1.0, 0.5), train=Scaling(0.3), sync=0.01)
    return Profile(key=key, runner="reasoning", costs=costs, runs=({"layout": "x"},), seconds=12.5)


def test_cache_round_trip_and_hit(tmp_path):
    settings = AutoSettings(cache_dir=str(tmp_path))
    run = _run()
    key = profile_key(run)
    assert load_cached(settings, key) is None
    path = save_cached(settings, _profile(key))
    assert path == cache_file(settings, key)
    got = load_cached(settings, key)
    assert got.source == "cache" and got.costs == _profile(key).costs and got.path == path
    # get_profile reads the cache: no profiling run starts (this test has no Ray)
    assert get_profile(run, settings, str(tmp_path / "runs")).source == "cache"
    assert not (tmp_path / "runs").exists()


def test_cache_of_another_version_or_key_is_ignored(tmp_path):
    settings = AutoSettings(cache_dir=str(tmp_path))
    path = save_cached(settings, _profile("k"))
    data = json.loads(open(path).read())
    data["version"] = 0
    open(path, "w").write(json.dumps(data))
    assert load_cached(settings, "k") is None
    open(path, "w").write("{not json")
    assert load_cached(settings, "k") is None


def test_profile_run_config_bounds_the_run(tmp_path):
    run = _run()
    cfg = profile_run_config(
        run, Candidate("collocated", (0, 2), (0, 2), fused=True), 5, 42.0, str(tmp_path)
    )
    t = cfg.trainer
    assert (t.total_steps, t.eval_every, t.save_every, t.time_budget_s) == (5, 0, 0, 42.0)
    assert t.resume is None and t.target_accuracy is None
    assert t.checkpoint_dir == str(tmp_path / "checkpoints")
    assert cfg.logging.trace and cfg.logging.jsonl and not cfg.logging.progress
    assert cfg.placement.fuse == "auto"  # a run that cannot fuse takes turns instead
    assert cfg.placement.component_placement["actor"] == "0-1"


def test_key_changes_with_the_optimizer_and_the_tool_pool():
    run = _run()
    key = profile_key(run)
    ds = dataclasses.replace(
        run, optimizer=dataclasses.replace(run.optimizer, name="deepspeed_adamw")
    )
    changed = [ds] + [
        dataclasses.replace(run, tools=dataclasses.replace(run.tools, **{name: value}))
        for name, value in (("slots", 2), ("concurrency", 1), ("pool_size", 1))
    ]
    assert len({key, *(profile_key(r) for r in changed)}) == 5
