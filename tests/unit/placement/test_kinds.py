"""A new kind is its module plus one registry entry: a toy engine and a toy component, each
registered for one test, are picked up by validation, the plan, fusion and the builders."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from placement_helpers import compose

from rltrain.errors import ConfigError
from rltrain.kinds import registry
from rltrain.kinds.records import ComponentKind, EngineKind, load
from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec
from rltrain.runners.builders import component_builders
from rltrain.runners.fusion import fusion_blockers

HERE = sys.modules[__name__].__name__


def _toy_check(cfg: Any) -> Iterator[str]:
    if cfg.rollout.top_p < 1:
        yield f"rollout.top_p={cfg.rollout.top_p} with rollout.backend='toy': it samples whole"


def toy_plan_problems(run: Any, cluster: Any, processes: tuple[Any, ...]) -> list[str]:
    """The toy engine's plan-time rule: one problem naming its processes."""
    return [f"toy engine on {len(processes)} rollout process(es)"]


TOY_ENGINE = EngineKind(
    name="toy",
    role="generation",
    summary="a toy generation engine",
    runtime=f"{HERE}:ToyWorker",
    runners=("reasoning",),
    kv_reserved=True,
    config_checks=(_toy_check,),
    plan_problems=(f"{HERE}:toy_plan_problems",),
)


class ToyWorker:
    """Stands for a worker class: records what ``create_group`` was given."""

    @classmethod
    def create_group(cls, run: Any, *layout_fields: Any) -> tuple[str, tuple[Any, ...]]:
        return ("toy group", layout_fields)


JUDGE = ComponentKind(
    name="judge",
    summary="a toy judge component",
    workers={"reasoning": f"{HERE}:ToyWorker"},
    layout_args=("sizes",),
)


def test_a_registered_engine_is_a_valid_value_with_its_checks():
    with pytest.raises(ConfigError, match=r"rollout.backend='toy' is not valid: choose one of"):
        compose("collocated", **{"rollout.backend": "toy"})
    with registry.registered(TOY_ENGINE):
        assert "toy" in registry.engine_names("generation")
        run = compose("collocated", **{"rollout.backend": "toy"})
        assert registry.generation_engine(run) is TOY_ENGINE
        with pytest.raises(ConfigError, match="it samples whole"):
            compose("collocated", **{"rollout.backend": "toy", "rollout.top_p": 0.5})
        with pytest.raises(ConfigError, match="rollout.backend='toy' with runner='embodied'"):
            compose("collocated", **{"rollout.backend": "toy", "runner": "embodied"})
    assert "toy" not in registry.engine_names("generation")


def test_the_plan_reads_the_engines_memory_terms_and_plan_rules():
    base = compose("disaggregated")
    cluster = ClusterSpec.from_config(base.cluster)
    torch_plan = build_plan(base, cluster, check_fit=False)
    with registry.registered(TOY_ENGINE):
        run = compose("disaggregated", **{"rollout.backend": "toy"})
        plan = build_plan(run, cluster, check_fit=False)
    want = f"toy engine on {plan.world_size('rollout')} rollout process(es)"
    assert list(plan.engine_problems) == [want]
    assert not torch_plan.engine_problems

    def kv(p: Any) -> int:
        return sum(
            t.bytes
            for m in p.memory.values()
            for s in m.stages
            for t in s.terms
            if (t.component, t.kind) == ("rollout", "kv_cache")
        )

    # kv_reserved: the cache is the reserved share of the device, not sized by the batch
    assert kv(plan) > kv(torch_plan)


def test_fusion_names_an_engine_that_cannot_share_parameters():
    with registry.registered(TOY_ENGINE):
        run = compose("collocated", **{"rollout.backend": "toy"})
        plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
        blockers = fusion_blockers(run, plan)
    assert any("rollout.backend='toy': only the torch engines" in b for b in blockers)


def test_a_registered_component_is_placeable_and_built():
    run = compose("collocated")
    assert "judge" not in component_builders(run, "reasoning")
    with registry.registered(JUDGE):
        builders = component_builders(run, "reasoning")
        layout = SimpleNamespace(sizes="the sizes")
        assert builders["judge"](layout) == ("toy group", ("the sizes",))
        assert load(f"{HERE}:ToyWorker") is ToyWorker
        placed = compose("collocated", **{"placement.component_placement.judge": "all"})
        plan = build_plan(placed, ClusterSpec.from_config(placed.cluster), check_fit=False)
        assert "judge" in plan.components and plan.world_size("judge") >= 1
    with pytest.raises(ConfigError, match="judge"):
        compose("collocated", **{"placement.component_placement.judge": "all"})


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.engine("generation", "torch"))


def test_carry_multi_turn_and_the_build_dtype_follow_the_engines_entries():
    """What was a test of the name "torch" is a property of the entry: a toy engine with
    ``segments``/``multi_turn`` is accepted where one without them is refused, naming the
    engines that have them."""
    from rltrain.backends.training import build_dtype
    from rltrain.tasks.text_env import env_problems

    able = dataclasses.replace(
        TOY_ENGINE, name="toy_able", segments=True, multi_turn=True, config_checks=()
    )
    carry = {
        "trainer.max_staleness": 2,
        "trainer.partial_rollout": "carry",
        "simulate.response_length_median": 8,
        "simulate.rollout_token_latency_ms": 5,
    }
    # a second multi-turn engine (as a new one added by the guide): the message lists them all
    echo = dataclasses.replace(able, name="toy_echo")
    with registry.registered(TOY_ENGINE, able, echo):
        compose("disaggregated", **carry, **{"rollout.backend": "toy_able"})
        with pytest.raises(ConfigError, match=r"rollout.backend='toy'.*set rollout.backend=torch"):
            compose("disaggregated", **carry, **{"rollout.backend": "toy"})
        env = compose("collocated", **{"rollout.backend": "toy_able"})
        env.task.env = "rltrain.tasks.calc_tool:CalculatorEnv"
        assert not [p for p in env_problems(env) if "multi-turn episodes" in p]
        env.rollout.backend = "toy"
        (problem,) = [p for p in env_problems(env) if "multi-turn episodes" in p]
        able_names = list(registry.engine_names("generation", having="multi_turn"))
        assert {"torch", "toy_able", "toy_echo"} <= set(able_names) and "toy" not in able_names
        assert str(able_names) in problem and "got rollout.backend='toy'" in problem
    run = compose("collocated", **{"model.dtype": "bfloat16"})
    assert build_dtype(run) == "float32"  # the torch engine keeps fp32 masters
    masters = registry.training_engine(run)
    plain = dataclasses.replace(masters, name="toy_plain", fp32_masters=False)
    with registry.registered(plain):
        run.actor.backend = "toy_plain"
        assert build_dtype(run) == "bfloat16"


def test_a_component_the_fused_worker_does_not_host_stops_fusion_saying_so():
    with registry.registered(JUDGE):
        run = compose("collocated", **{"placement.component_placement.judge": "all"})
        plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
        blockers = fusion_blockers(run, plan)
    assert any(
        "['judge'], which the fused worker does not host" in b and "placement.fuse=false" in b
        for b in blockers
    )


def test_a_component_saying_fused_that_the_fused_worker_does_not_host_stops_fusion():
    """``fused`` alone does not make a component join a fused rank (the fused worker hosts a
    fixed list): a placed one is refused, not dropped."""
    from rltrain.runners.fusion import FUSED_WORKER_HOSTS, fused_components

    claims = dataclasses.replace(JUDGE, fused=True)
    with registry.registered(claims):
        assert "judge" not in fused_components()
        assert set(fused_components()) == set(FUSED_WORKER_HOSTS)
        run = compose("collocated", **{"placement.component_placement.judge": "all"})
        plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
        blockers = fusion_blockers(run, plan)
    (blocker,) = [b for b in blockers if "which the fused worker does not host" in b]
    assert "the entries of ['judge'] say fused, but the fused worker hosts only" in blocker


PRE_RAY_CALLS: list[tuple[Any, ...]] = []


def toy_pre_ray(*args: Any) -> None:
    """A pre-Ray check written to ``EngineKind.pre_ray_checks``' documented signature."""
    PRE_RAY_CALLS.append(args)


def test_the_pre_ray_checks_get_the_arguments_their_entry_documents():
    from rltrain.runners import layout

    assert "``(run, plan) -> None``" in (EngineKind.__doc__ or "")
    training = dataclasses.replace(
        registry.engine("training", "torch"),
        name="toy_train",
        pre_ray_checks=(f"{HERE}:toy_pre_ray",),
    )
    PRE_RAY_CALLS.clear()
    with registry.registered(training):
        run = compose("collocated", **{"actor.backend": "toy_train"})
        plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
        layout.check_components(run, set(plan.components))
        layout.check_engines(run, plan)
    assert PRE_RAY_CALLS == [(run, None), (run, plan)]


def test_an_offload_policy_is_checked_against_the_components_declared_state_kinds():
    judge = dataclasses.replace(JUDGE, state_kinds=("weights",))
    overrides = {
        "placement.component_placement.judge": "all",
        "placement.offload.judge": {"when": "after_stage", "states": ["optimizer"]},
    }
    with registry.registered(judge):
        with pytest.raises(ConfigError, match=r"optimizer'\] that judge does not hold"):
            compose("collocated", **overrides)
        overrides["placement.offload.judge"] = {"when": "after_stage", "states": ["weights"]}
        compose("collocated", **overrides)
