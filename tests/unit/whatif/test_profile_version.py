"""A profile cached when ``time/train_s`` still held the weight sync (version 2) is not reused:
the simulator would add the sync on top of a training time that already holds it."""

from __future__ import annotations

import dataclasses
import json

from rltrain.config.schema import RunConfig
from rltrain.whatif import profiles
from rltrain.whatif.profiles import cached_costs, profile_key


def _run(cache_dir: str) -> RunConfig:
    run = RunConfig()
    auto = dataclasses.replace(run.placement.auto, cache_dir=cache_dir)
    return dataclasses.replace(run, placement=dataclasses.replace(run.placement, auto=auto))


def _write(folder, key: str, version: int) -> None:
    data = {"version": version, "key": key, "costs": {"runner": "reasoning"}}
    (folder / f"{key}.json").write_text(json.dumps(data))


def test_a_profile_that_timed_the_sync_inside_train_is_refused(tmp_path, monkeypatch):
    run = _run(str(tmp_path))
    with monkeypatch.context() as m:  # the key and file a version-2 profiling run wrote
        m.setattr(profiles, "PROFILE_VERSION", 2)
        old_key = profile_key(run)
    _write(tmp_path, old_key, 2)
    assert cached_costs(run) is None
    _write(tmp_path, profile_key(run), 2)  # even under the current key: its version is refused
    assert cached_costs(run) is None


def test_a_profile_of_the_current_version_is_reused(tmp_path):
    run = _run(str(tmp_path))
    key = profile_key(run)
    _write(tmp_path, key, profiles.PROFILE_VERSION)
    assert cached_costs(run) == ({"runner": "reasoning"}, str(tmp_path / f"{key}.json"))


def test_a_planned_run_finds_the_profile_auto_keyed_with_null_micro_batches(tmp_path):
    run = _run(str(tmp_path))
    assert run.actor.micro_batch_size is None  # placement=auto keys its profile so
    key = profile_key(run)
    _write(tmp_path, key, profiles.PROFILE_VERSION)
    # mode=plan has chosen the sizes for its layout before it looks the profile up
    sized = dataclasses.replace(run, actor=dataclasses.replace(run.actor, micro_batch_size=64))
    assert profile_key(sized) != key
    assert cached_costs(sized) is None  # its own key finds nothing
    assert cached_costs(sized, run) == ({"runner": "reasoning"}, str(tmp_path / f"{key}.json"))
    # a size the user set stays in the key: a profile measured with other sizes is not used
    mine = dataclasses.replace(run, actor=dataclasses.replace(run.actor, micro_batch_size=1))
    assert cached_costs(mine, mine) is None
