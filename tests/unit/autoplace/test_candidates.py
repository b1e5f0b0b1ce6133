"""Candidate enumeration and each candidate as a run config (pure, hand-counted)."""

from __future__ import annotations

import dataclasses

from rltrain.autoplace.candidates import (
    Candidate,
    apply,
    component_placement,
    embodied_candidates,
    offload_policies,
    partial_rollout_policies,
    reasoning_candidates,
    span_text,
    stage_counts,
)
from rltrain.config.schema import OffloadPolicyConfig, RunConfig


def test_reasoning_on_two_devices_lists_six_layouts():
    cands = reasoning_candidates(2)
    assert [c.name for c in cands] == [
        "collocated 0-1 fused",
        "collocated 0-1 turns",
        "disaggregated actor 0 rollout 1",
        "disaggregated actor 0 rollout 1 async1",
        "disaggregated actor 0 rollout 1 async1 continue",
        "hybrid actor 0-1 rollout 1",
    ]
    assert [c.partial_rollout for c in cands if c.staleness] == ["finish", "continue"]
    assert all(c.partial_rollout == "finish" for c in cands if not c.staleness)


def test_reasoning_count_is_linear_in_devices():
    # 2 collocated + (D-1) splits x (1 synchronous + 2 asynchronous policies + 1 hybrid)
    for d in (1, 2, 4, 8, 64):
        assert len(reasoning_candidates(d)) == 2 + (d - 1) * 4
    assert len(reasoning_candidates(8, staleness=(0,))) == 2 + 7 * 2
    assert len(reasoning_candidates(8, families=("disaggregated",))) == 7 * 3
    every = reasoning_candidates(2, partial_rollout=("finish", "continue", "restart"))
    assert [c.name for c in every if c.staleness][
        -1
    ] == "disaggregated actor 0 rollout 1 async1 restart"
    assert len(reasoning_candidates(8, partial_rollout=("continue",))) == 2 + 7 * 3


def test_partial_rollout_policies_keep_the_users_choice():
    assert partial_rollout_policies(None, "finish") == ("finish", "continue")
    assert partial_rollout_policies(None, "restart") == ("restart",)
    assert partial_rollout_policies(None, "continue") == ("continue",)
    assert partial_rollout_policies(["restart", "finish"], "finish") == ("restart", "finish")


def test_splits_give_the_rollout_the_last_k_devices():
    dis = [c for c in reasoning_candidates(4) if c.family == "disaggregated" and not c.staleness]
    assert [(c.actor, c.rollout) for c in dis] == [
        ((0, 3), (3, 4)),
        ((0, 2), (2, 4)),
        ((0, 1), (1, 4)),
    ]
    assert not any(c.shares for c in dis)
    hyb = [c for c in reasoning_candidates(4) if c.family == "hybrid"]
    assert all(c.shares and c.actor == (0, 4) and not c.staleness for c in hyb)


def test_asynchronous_only_where_actor_and_rollout_are_apart():
    for c in reasoning_candidates(8):
        if c.staleness:
            assert c.family == "disaggregated" and not c.shares


def test_embodied_layouts_per_stage_count():
    cands = embodied_candidates(2, [1, 2])
    assert [c.name for c in cands] == [
        "collocated 0-1 S=1",
        "disaggregated actor 0 rollout 1 S=1",
        "hybrid env 0 actor 0-1 rollout 1 S=1",
        "collocated 0-1 S=2",
        "disaggregated actor 0 rollout 1 S=2",
        "hybrid env 0 actor 0-1 rollout 1 S=2",
    ]
    assert len(embodied_candidates(8, [1, 2, 4])) == (1 + 2 * 7) * 3


def test_stage_counts_divide_the_environments():
    assert stage_counts(16, [], (1, 2, 4, 8)) == [1, 2, 4, 8]
    assert stage_counts(6, [], (1, 2, 4, 8)) == [1, 2]
    assert stage_counts(16, [4, 2, 4], (1,)) == [2, 4]


def test_span_text_uses_the_grammar():
    assert span_text((3, 4)) == "3"
    assert span_text((0, 4)) == "0-3"


BASE_CP = {
    "actor,reference": "all",
    "rollout": "all",
    "reward": {"node_group": "node", "placement": "0"},
}


def test_component_placement_keeps_node_entries_and_puts_the_rest_on_the_actor():
    cand = Candidate("disaggregated", (0, 3), (3, 4))
    cp = component_placement(BASE_CP, cand)
    assert cp == {
        "actor": "0-2",
        "rollout": "3",
        "reference": "0-2",
        "reward": {"node_group": "node", "placement": "0"},
    }
    emb = component_placement(
        {"actor": "all", "env": "0", "rollout": "1"},
        Candidate("collocated", (0, 2), (0, 2), stages=2),
    )
    assert emb == {
        "actor": "0-1",
        "rollout": "0-1",
        "env": {"node_group": "node", "placement": "0"},
    }


def test_offload_only_where_components_share():
    base = {
        "actor": OffloadPolicyConfig(when="after_stage", states=["weights"]),
        "rollout": OffloadPolicyConfig(when="never"),
        "reference": OffloadPolicyConfig(when="after_stage"),
    }
    coll = offload_policies(base, Candidate("collocated", (0, 2), (0, 2)))
    assert coll["actor"] is base["actor"]  # the base's moving policy is kept
    assert coll["rollout"].when == "on_demand"  # "never" cannot take turns: on demand instead
    assert coll["reference"] is base["reference"]
    dis = offload_policies(base, Candidate("disaggregated", (0, 1), (1, 2)))
    assert set(dis) == {"reference"}
    hyb = offload_policies({}, Candidate("hybrid", (0, 2), (1, 2), env=(0, 1), stages=2))
    assert hyb["actor"].when == hyb["rollout"].when == "on_demand"
    assert "env" not in hyb  # a simulator holds no device state to move
    assert hyb["rollout"].states == ["weights"]


def test_apply_replaces_placement_staleness_stages_and_fusion():
    run = RunConfig()
    run = dataclasses.replace(
        run,
        placement=dataclasses.replace(
            run.placement, mode="collocated", component_placement=dict(BASE_CP)
        ),
    )
    out = apply(run, Candidate("disaggregated", (0, 1), (1, 2), staleness=1))
    assert out.placement.mode is None and out.placement.fuse == "false"
    assert out.placement.component_placement["rollout"] == "1"
    assert out.trainer.max_staleness == 1 and out.trainer.partial_rollout == "finish"
    assert run.trainer.max_staleness == 0 and run.placement.mode == "collocated"  # base untouched
    cont = apply(
        run, Candidate("disaggregated", (0, 1), (1, 2), staleness=1, partial_rollout="continue")
    )
    assert cont.trainer.partial_rollout == "continue" and run.trainer.partial_rollout == "finish"
    # a synchronous candidate of a run whose trainer asks for restart: no swap mid-generation
    restart = dataclasses.replace(
        run, trainer=dataclasses.replace(run.trainer, partial_rollout="restart")
    )
    assert apply(restart, Candidate("hybrid", (0, 2), (1, 2))).trainer.partial_rollout == "finish"
    fused = apply(run, Candidate("collocated", (0, 2), (0, 2), fused=True))
    assert fused.placement.fuse == "true"
    emb = apply(run, Candidate("collocated", (0, 2), (0, 2), stages=4))
    assert emb.env.pipeline_stage_num == 4


def test_carry_candidates_run_at_the_least_staleness_carry_runs_with():
    cands = reasoning_candidates(2, staleness=(0, 1), partial_rollout=("finish", "carry"))
    asynchronous = [(c.staleness, c.partial_rollout) for c in cands if c.staleness]
    assert asynchronous == [(1, "finish"), (2, "carry")]
    assert [c.name for c in cands if c.partial_rollout == "carry"] == [
        "disaggregated actor 0 rollout 1 async2 carry"
    ]
