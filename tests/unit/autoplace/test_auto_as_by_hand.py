"""placement=auto trains a layout as the same layout set by hand would run: each candidate's
config passes the config's own checks, its micro-batches are sized for its own layout, and the
keys auto sets itself are refused or honoured (real composed configs, a cached profile, no
Ray)."""

from __future__ import annotations

import dataclasses

import pytest

from rltrain.autoplace import AutoSettings, choose
from rltrain.autoplace.choose import PROFILE_DIR
from rltrain.autoplace.cost import ReasoningCosts, Scaling
from rltrain.autoplace.profile import Profile, profile_key, save_cached
from rltrain.autoplace.search import candidate_run
from rltrain.bench.measures.trainer import compose
from rltrain.errors import ConfigError
from rltrain.runners.layout import decide_for_user

# Generation-heavy: the asynchronous split wins, max(1.2, 0.4 + 0.02 + 0.01) = 1.2 s a step.
GEN_HEAVY = ReasoningCosts(
    generate=Scaling(1.2), train=Scaling(0.4), sync=0.02, overhead=0.01, fused_overhead=0.01
)
ASYNC = "disaggregated actor 0 rollout 1 async1"


def _settings(run, tmp_path, cached: bool = True) -> AutoSettings:
    settings = dataclasses.replace(AutoSettings.from_run(run), cache_dir=str(tmp_path / "c"))
    if cached:
        profile = Profile(key=profile_key(run), runner="reasoning", costs=GEN_HEAVY, runs=())
        save_cached(settings, profile)
    return settings


def _choose(tmp_path, *overrides: str):
    run = compose("placement=auto", *overrides)
    return choose(run, str(tmp_path), _settings(run, tmp_path))


def _rows(choice) -> dict[str, dict]:
    return {r["candidate"]: r for r in choice.ranking}


@pytest.mark.parametrize(
    "override, refusal",
    [
        # what `placement=disaggregated trainer.max_staleness=1` refuses with these keys
        (
            "algorithm.filter_groups=true",
            "algorithm.filter_groups=true with trainer.max_staleness=1",
        ),
        ("+placement.component_placement.inference=all", "with an inference component"),
    ],
)
def test_a_candidate_the_config_check_refuses_is_excluded_with_its_reason(
    tmp_path, override, refusal
):
    choice = _choose(tmp_path, override)
    rows = _rows(choice)
    assert rows[ASYNC]["status"] == "excluded" and refusal in rows[ASYNC]["reason"]
    assert choice.winner.candidate.staleness == 0  # the async split predicted fastest lost


def test_the_winner_sizes_its_micro_batches_as_the_same_layout_set_by_hand(tmp_path):
    choice = _choose(tmp_path)
    assert choice.winner.candidate.name == ASYNC
    assert choice.run.actor.micro_batch_size is None  # left for the winner's layout to size
    by_hand, _ = decide_for_user(compose("placement=disaggregated", "trainer.max_staleness=1"))
    sized = candidate_run(choice.run, choice.winner.candidate)
    # 8 prompts x 16 samples = 128 rows, all on the one actor rank (collocated: 64 on each of 2)
    assert sized.actor.micro_batch_size == by_hand.actor.micro_batch_size == 128
    assert decide_for_user(choice.run)[0].actor.micro_batch_size == 128
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec

    plan = build_plan(by_hand, ClusterSpec.from_config(by_hand.cluster), check_fit=False)
    assert choice.winner.peak_bytes == max(m.peak_bytes for m in plan.memory.values())


def test_fuse_false_leaves_the_fused_layout_out(tmp_path):
    choice = _choose(tmp_path, "placement.fuse=false")
    assert all(not r.candidate.fused for r in choice.rows)
    assert "collocated 0-1 turns" in _rows(choice) and len(choice.rows) == 5


@pytest.mark.parametrize(
    "override, key",
    [
        ("placement.fuse=true", "placement.fuse=true with placement=auto"),
        ("trainer.max_staleness=1", "trainer.max_staleness=1 with placement=auto"),
        ("whatif.steps=5", "whatif.steps=5 with placement=auto"),
        (
            "placement.auto.staleness=[0]",
            "trainer.partial_rollout=carry with placement.auto.staleness=[0]",
        ),
    ],
)
def test_keys_auto_sets_itself_are_refused_before_it_starts(override, key):
    extra = ("trainer.partial_rollout=carry",) if "staleness=[0]" in override else ()
    with pytest.raises(ConfigError) as err:
        compose("placement=auto", override, *extra)
    assert any(p.startswith(key) for p in err.value.problems), err.value.problems


def test_carry_is_tried_by_the_asynchronous_candidates(tmp_path):
    choice = _choose(tmp_path, "trainer.partial_rollout=carry", "trainer.carry_segment=4")
    rows = _rows(choice)
    carry = "disaggregated actor 0 rollout 1 async2 carry"
    assert choice.winner.candidate.name == carry
    assert choice.run.trainer.max_staleness == 2 and choice.run.trainer.carry_segment == 4
    # the synchronous ones finish, without carry's keys, and pass the checks
    assert rows["disaggregated actor 0 rollout 1"]["status"] == "ok"
    assert all(r["partial_rollout"] in ("carry", "finish") for r in rows.values())


def test_no_candidate_on_the_cluster_is_refused_before_profiling(tmp_path):
    run = compose(
        "placement=auto",
        "cluster.devices_per_node=1",
        "placement.auto.candidates=[disaggregated,hybrid]",
    )
    with pytest.raises(ConfigError) as err:  # no cached profile: it would profile first
        choose(run, str(tmp_path), _settings(run, tmp_path, cached=False))
    (problem,) = err.value.problems
    assert problem.startswith(
        "placement.auto.candidates=['disaggregated', 'hybrid'] gives no candidate layout on 1 "
        "device(s)"
    )
    assert "add collocated to placement.auto.candidates" in problem
    assert not (tmp_path / PROFILE_DIR).exists()


def test_embodied_hybrid_candidates_pass_the_checks_of_the_layout_set_by_hand():
    # a simulator holds no device state: sharing the actor's devices gives it no offload policy
    from rltrain.autoplace.choose import devices, enumerate_for
    from rltrain.autoplace.search import check_candidate

    run = compose("experiment=cartpole_hybrid", "placement.mode=auto")
    hybrid = [
        c for c in enumerate_for(run, AutoSettings.from_run(run), devices(run)) if c.env is not None
    ]
    assert hybrid
    assert {check_candidate(run, c)[0] for c in hybrid} == {""}
