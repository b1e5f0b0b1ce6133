"""A component added as ARCHITECTURE.md's "Extending" says is reached through its entry: weight
sync feeds every component whose entry says ``receives_weights``, and a stage reaches any
started component's group by its name."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
from composed import composed_run as compose_run

from rltrain.config import engine_checks
from rltrain.errors import WorkerError
from rltrain.kinds import registry
from rltrain.kinds.records import ComponentKind
from rltrain.placement import transport_choice
from rltrain.placement.plan import build_plan
from rltrain.placement.transport_choice import TransportChoice
from rltrain.placement.types import ClusterSpec
from rltrain.runners import layout, weight_hub
from rltrain.runners.stages import ReasoningGroups
from rltrain.runners.weight_hub import WeightHub

MIRROR = ComponentKind(name="mirror", summary="a toy weight receiver", receives_weights=True)
JUDGE = ComponentKind(name="judge", summary="a toy component that takes no weights")


class Group:
    """A stand-in worker group: records the methods called on it."""

    def __init__(self, name: str, log: list[tuple[str, Any]]) -> None:
        self.name, self.log = name, log

    def call(self, method: Any, *args: Any) -> Any:
        self.log.append((self.name, method))
        return SimpleNamespace(wait=lambda timeout=None: [1])


class Worker:
    setup_weight_sync = "setup_weight_sync"


def test_the_receivers_are_the_components_whose_entry_says_so():
    assert {"rollout", "inference"} <= set(registry.weight_receivers())
    assert "mirror" not in registry.weight_receivers()
    with registry.registered(MIRROR, JUDGE):
        receivers = registry.weight_receivers()
        assert "mirror" in receivers and "judge" not in receivers
    assert "mirror" not in registry.weight_receivers()


def test_a_registered_receiver_gets_a_transport_and_is_set_up(monkeypatch):
    """The hub chooses a transport for, and sets up, every started receiver, the toy one too
    (its group reached by name although ReasoningGroups has no field for it)."""
    monkeypatch.setattr(
        weight_hub, "choose_transport", lambda run, plan, r: TransportChoice("host", "toy")
    )
    log: list[tuple[str, Any]] = []
    names = ("actor", "rollout", "mirror", "judge")
    groups = ReasoningGroups.of({n: Group(n, log) for n in names})  # type: ignore[arg-type]
    job = SimpleNamespace(run=None, plan=None, stage=lambda c: nullcontext())
    with registry.registered(MIRROR, JUDGE):
        hub = WeightHub(job, groups, Worker, Worker)
    assert set(hub.transports) == {"rollout", "mirror"}
    assert ("mirror", "setup_weight_sync") in log and ("judge", "setup_weight_sync") not in log


def test_the_pre_ray_transport_check_asks_every_receiver(monkeypatch):
    asked: list[str] = []
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: False)
    monkeypatch.setattr(transport_choice, "choose_transport", lambda run, plan, r: asked.append(r))
    run = compose_run()
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    with registry.registered(MIRROR):
        layout.check_engines(run, plan)
    assert "mirror" in asked and {"rollout", "inference"} <= set(asked)


def test_a_stage_reaches_a_new_components_group_by_name():
    log: list[tuple[str, Any]] = []
    mirror = Group("mirror", log)
    groups = ReasoningGroups.of({"actor": Group("actor", log), "mirror": mirror})  # type: ignore[arg-type]
    assert groups.need("mirror") is mirror and groups.receiver("mirror") is mirror
    assert groups.receiver("inference") is None
    with pytest.raises(WorkerError, match="this job has no critic group"):
        groups.need("critic")
    with pytest.raises(WorkerError, match="this job has no judge group"):
        groups.need("judge")


def test_a_multi_turn_engine_has_model_and_eos_ids_besides_the_protocol():
    """``EngineKind.multi_turn`` names the members the episodes read beyond
    ``GenerationEngine``; an engine without them cannot run ``task.env``."""
    from rltrain.agents.interaction import ToolEpisodes, engine_interaction
    from rltrain.kinds.records import EngineKind
    from rltrain.tasks import build_tokenizer

    doc = EngineKind.__doc__ or ""
    assert "``model``" in doc and "``eos_ids``" in doc
    run = compose_run("experiment=calc_tool")
    tokenizer = build_tokenizer(run.model)
    engine = SimpleNamespace(device="cpu", tokenizer=tokenizer, model=None, eos_ids=[0])
    assert isinstance(engine_interaction(run, engine), ToolEpisodes)
    del engine.eos_ids
    with pytest.raises(AttributeError, match="eos_ids"):
        engine_interaction(run, engine)
