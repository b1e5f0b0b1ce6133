"""No valid candidate among those checked: the refusal says how many were left unchecked by
``placement.auto.max_checked`` and to raise it, instead of claiming no layout is valid."""

from __future__ import annotations

import pytest

from rltrain.autoplace import AutoSettings, choose
from rltrain.autoplace.cost import ReasoningCosts, Scaling
from rltrain.autoplace.profile import Profile, profile_key, save_cached
from rltrain.bench.measures.trainer import compose
from rltrain.errors import ConfigError

# 2 devices of 35.5 MiB: the fused and the disaggregated layouts do not fit; the turn-taking
# collocated and the hybrid ones do.
TIGHT = ("placement=auto", "cluster.device_memory_gib=0.0347", "actor.micro_batch_size=128")
GEN_HEAVY = ReasoningCosts(
    generate=Scaling(1.2), train=Scaling(0.4), sync=0.02, overhead=0.01, fused_overhead=0.01
)


def _settings(run, tmp_path, max_checked: int) -> AutoSettings:
    settings = AutoSettings(cache_dir=str(tmp_path / "cache"), max_checked=max_checked)
    key = profile_key(run)
    save_cached(settings, Profile(key=key, runner="reasoning", costs=GEN_HEAVY, runs=()))
    return settings


def test_max_checked_refusals_say_how_many_were_left_unchecked(tmp_path):
    run = compose(*TIGHT)
    # the two fastest predicted (the asynchronous split, the fused layout) are refused
    with pytest.raises(ConfigError) as err:
        choose(run, str(tmp_path), _settings(run, tmp_path, max_checked=2))
    head, *reasons = err.value.problems
    assert head == (
        "placement=auto: none of the 2 candidate layouts checked passes the checks training "
        "makes, and 4 of the 6 were not checked (placement.auto.max_checked=2): raise "
        "placement.auto.max_checked (to 6 to check every one); each checked one's reason follows"
    )
    assert [r.split(":")[0] for r in reasons] == [
        "disaggregated actor 0 rollout 1 async1",
        "collocated 0-1 fused",
    ]
    # checking every one finds the valid layouts
    choice = choose(run, str(tmp_path / "all"), _settings(run, tmp_path / "all", max_checked=6))
    assert choice.winner.status == "ok"
