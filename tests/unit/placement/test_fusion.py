"""placement.fuse: when actor, rollout and reward share processes (pure rules, no Ray)."""

from __future__ import annotations

import pytest
from placement_helpers import compose

from rltrain.errors import ConfigError
from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec
from rltrain.runners.fusion import decide_fusion, fusion_blockers


def plan_of(run):
    return build_plan(run, ClusterSpec.from_config(run.cluster))


def test_shipped_collocated_fuses():
    run = compose("collocated")
    assert run.placement.fuse == "auto"
    assert fusion_blockers(run, plan_of(run)) == []
    assert decide_fusion(run, plan_of(run)) == (True, [])


@pytest.mark.parametrize("placement", ["disaggregated", "hybrid"])
def test_layouts_with_separate_devices_do_not_fuse(placement):
    run = compose(placement, **{"placement.fuse": "auto"})
    blockers = fusion_blockers(run, plan_of(run))
    assert "different processes" in blockers[0]
    assert decide_fusion(run, plan_of(run)) == (False, blockers)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"placement.offload.actor.when": "after_stage"}, "placement.offload.actor.when"),
        ({"placement.offload.rollout.when": "after_stage"}, "placement.offload.rollout.when"),
        ({"algorithm.advantage_estimator": "reinforce_pp"}, "reinforce_pp"),
        ({"actor.backend": "deepspeed"}, "actor.backend='deepspeed'"),
        ({"rollout.backend": "vllm"}, "rollout.backend='vllm'"),
        ({"trainer.max_staleness": 1}, "trainer.max_staleness=1"),
        ({"cluster.device_memory_gib": 0.0347}, "cannot hold every component's state"),
    ],
)
def test_each_obstacle_is_named_with_its_key(overrides, needle):
    # 0.0347 GiB (37,258,905 B): the train stage needs 37,196,800 B resident (the rollout's
    # state evicted on demand), but all of both components' state is 37,542,144 B (plan.memory)
    # vLLM runs on GPUs only: its case plans for a GPU cluster (cluster=ray).
    gpu = overrides.get("rollout.backend") == "vllm"
    run = compose("collocated", cluster="ray" if gpu else "local", **overrides)
    plan = plan_of(run)
    blockers = fusion_blockers(run, plan)
    assert any(needle in b for b in blockers), blockers
    assert decide_fusion(run, plan)[0] is False


def test_memory_rule_compares_all_state_at_once_with_the_capacity():
    plan = plan_of(compose("collocated"))
    train = next(s for s in plan.memory[(0, 0)].stages if s.stage == "train")
    assert train.required_bytes < 0.0347 * 1024**3 < sum(t.bytes for t in train.terms)


def test_a_reference_in_the_placement_blocks_fusion():
    run = compose(
        "collocated",
        **{"algorithm.kl_coef": 0.01, "placement.component_placement.reference": "all"},
    )
    blockers = fusion_blockers(run, plan_of(run))
    assert any("['reference']" in b for b in blockers), blockers


def test_fuse_true_refuses_with_the_reasons_and_the_fix():
    run = compose(
        "collocated",
        **{"placement.fuse": "true", "placement.offload.actor.when": "after_stage"},
    )
    with pytest.raises(ConfigError, match=r"placement.fuse=true.*after_stage.*placement.fuse=auto"):
        decide_fusion(run, plan_of(run))


def test_fuse_false_never_fuses_and_embodied_never_fuses():
    assert decide_fusion(compose("collocated", **{"placement.fuse": "false"}), None) == (
        False,
        [],
    )
    run = compose("collocated")
    run.runner = "embodied"  # its env/rollout pipeline has its own worker layout
    assert decide_fusion(run, None) == (False, [])


def test_bad_fuse_value_is_refused_before_anything_runs():
    with pytest.raises(ConfigError, match=r"placement.fuse='sometimes'.*'auto', 'true', 'false'"):
        compose("collocated", **{"placement.fuse": "sometimes"})
