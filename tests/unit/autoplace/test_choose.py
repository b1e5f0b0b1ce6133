"""choose() on real composed configs with a cached profile (no Ray): the checks training makes
exclude what does not fit, the winner is a concrete run config, the ranking is written."""

from __future__ import annotations

import json

import pytest

from rltrain.autoplace import AutoSettings, choose
from rltrain.autoplace.candidates import reasoning_candidates
from rltrain.autoplace.cost import ReasoningCosts, Scaling
from rltrain.autoplace.profile import Profile, profile_key, save_cached
from rltrain.autoplace.search import check_candidate
from rltrain.bench.measures.trainer import compose
from rltrain.errors import ConfigError

# 2 devices of 35.5 MiB: two actor ranks (micro-batches of 64) fit beside nothing else; one rank
# trains micro-batches of 128, twice the activations; all components at once do not fit.
TIGHT = ("cluster.device_memory_gib=0.0347", "actor.micro_batch_size=128")


def test_check_candidate_gives_the_plans_reasons():
    run = compose(*TIGHT)
    got = {c.name: check_candidate(run, c) for c in reasoning_candidates(2)}
    assert "cannot share processes" in got["collocated 0-1 fused"][0]
    for name in ("disaggregated actor 0 rollout 1", "disaggregated actor 0 rollout 1 async1"):
        reason, peak, mode = got[name]
        assert "the plan does not fit" in reason and "actor.micro_batch_size" in reason
        assert mode == "disaggregated" and peak > 0.0347 * 2**30
    for name in ("collocated 0-1 turns", "hybrid actor 0-1 rollout 1"):
        assert got[name][0] == ""
    assert got["hybrid actor 0-1 rollout 1"][2] == "hybrid"


def _cache(run, tmp_path, costs) -> AutoSettings:
    settings = AutoSettings(cache_dir=str(tmp_path / "cache"))
    key = profile_key(run)
    save_cached(settings, Profile(key=key, runner="reasoning", costs=costs, runs=()))
    return settings


GEN_HEAVY = ReasoningCosts(
    generate=Scaling(1.2), train=Scaling(0.4), sync=0.02, overhead=0.01, fused_overhead=0.01
)


def test_choose_runs_the_fastest_valid_layout(tmp_path):
    run = compose("placement=auto")
    choice = choose(run, str(tmp_path), _cache(run, tmp_path, GEN_HEAVY))
    assert choice.profile.source == "cache"
    assert choice.winner.candidate.name == "disaggregated actor 0 rollout 1 async1"
    assert choice.rows[0] is choice.winner and len(choice.rows) == 6
    w = choice.run
    assert w.placement.mode is None and w.trainer.max_staleness == 1
    assert w.placement.component_placement["actor"] == "0"
    assert w.placement.component_placement["rollout"] == "1"
    assert w.placement.offload == {}  # nothing shares a device
    assert choice.text.splitlines()[3].startswith("  1* disaggregated actor 0 rollout 1 async1")
    doc = json.loads((tmp_path / "auto_placement.json").read_text())
    assert doc["winner"] == choice.winner.candidate.name and len(doc["ranking"]) == 6
    assert (tmp_path / "auto_placement.txt").read_text().strip() == choice.text
    # the what-if simulator's second opinion, calibrated from the same profile: generation
    # (1.2 s, all of it rltrain's host work here: no simulate.* latency) bounds the async step
    sim = {r["candidate"]: r["simulated_s_per_step"] for r in doc["ranking"]}
    assert sim[choice.winner.candidate.name] == pytest.approx(1.2, rel=0.05)
    assert "what-if simulator, calibrated from the same profile" in choice.text


def test_choose_excludes_what_does_not_fit(tmp_path):
    run = compose("placement=auto", *TIGHT)
    choice = choose(run, str(tmp_path), _cache(run, tmp_path, GEN_HEAVY))
    rows = {r["candidate"]: r for r in choice.ranking}
    assert rows["disaggregated actor 0 rollout 1 async1"]["status"] == "excluded"
    assert choice.winner.candidate.name == "collocated 0-1 turns"  # ties hybrid: simpler


def test_choose_refuses_when_nothing_fits(tmp_path):
    # below what even one row per micro-batch needs (each layout sizes its micro-batches)
    run = compose("placement=auto", "cluster.device_memory_gib=0.002")
    with pytest.raises(ConfigError) as err:
        choose(run, str(tmp_path), _cache(run, tmp_path, GEN_HEAVY))
    assert len(err.value.problems) == 1 + 6
    assert "collocated 0-1 turns: " in "\n".join(err.value.problems)
