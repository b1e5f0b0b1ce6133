"""The records a kind is declared with (frozen; pure data plus pure check functions)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: A config check: the problems (key, value, fix) a checked run config has, empty when fine.
ConfigCheck = Callable[[Any], Iterator[str]]

#: The config key whose value names the engine, per role.
ENGINE_KEYS = {"training": "actor.backend", "generation": "rollout.backend"}


@dataclass(frozen=True)
class EngineKind:
    """One training or generation engine (the value of ``actor.backend``/``rollout.backend``).

    Attributes:
        name: the config value.
        role: ``training`` (the actor's engine) or ``generation`` (the rollout's).
        summary: one line for the docs.
        runtime: ``module:callable`` building the engine in a worker (``(run, model, device,
            micro_batch, minibatch)`` for training, ``(run, device, rank)`` for generation).
        runners: the runner kinds that can use it.
        needs_cuda: it cannot run on CPU (refused before Ray on a machine without GPUs).
        package: a package it imports (refused before Ray when missing), or None.
        install: how to install ``package`` (the refusal's fix).
        fusable: it can share its parameters in process with the other role's engine
            (``placement.fuse``).
        zero: it shards optimizer state with ZeRO (``actor.zero_stage``).
        kv_reserved: its KV cache is a reserved share of device memory
            (``rollout.gpu_memory_utilization``), not sized by the batch.
        max_model_len: it reads ``rollout.max_model_len``.
        own_kernels: it computes log-probs with its own kernels (not the trainer's).
        segments: it decodes carried rows in segments across calls
            (``trainer.partial_rollout=carry``).
        multi_turn: it runs ``task.env``'s multi-turn episodes (tool calls between turns):
            the episodes decode with the engine's own torch module, so the engine then also
            has ``model`` (the ``torch.nn.Module`` it samples with) and ``eos_ids`` (its stop
            token ids), besides the ``GenerationEngine`` members
            (:func:`rltrain.agents.interaction.engine_interaction` reads them).
        fp32_masters: a training engine that takes the model built in float32 and casts it to
            ``model.dtype`` itself, keeping the unrounded values as its fp32 masters (others
            get the model built in ``model.dtype``).
        config_checks: more checks of the run config when this engine is chosen.
        pre_ray_checks: ``module:function`` ``(run, plan) -> None`` raising ``ConfigError``,
            run on the plan before Ray starts; a training engine's also runs once before the
            plan, with ``plan=None``, when the placed components are checked.
        plan_problems: ``module:function`` ``(run, cluster, processes) -> list[str]`` the plan
            reports as engine problems (an engine that would refuse to start).
    """

    name: str
    role: str
    summary: str
    runtime: str
    runners: tuple[str, ...] = ("reasoning", "embodied")
    needs_cuda: bool = False
    package: str | None = None
    install: str = ""
    fusable: bool = False
    zero: bool = False
    kv_reserved: bool = False
    max_model_len: bool = False
    own_kernels: bool = False
    segments: bool = False
    multi_turn: bool = False
    fp32_masters: bool = False
    config_checks: tuple[ConfigCheck, ...] = ()
    pre_ray_checks: tuple[str, ...] = ()
    plan_problems: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The config key this engine is a value of."""
        return ENGINE_KEYS[self.role]


#: A worker by import string, or a function of the run config returning one (variants).
WorkerPath = str | Callable[[Any], str]


@dataclass(frozen=True)
class ComponentKind:
    """One component a placement may name (``placement.component_placement.<name>``).

    Attributes:
        name: the component's name in placements.
        summary: one line for the docs.
        workers: per runner kind, ``module:Class`` of its worker (a ``Worker`` with
            ``create_group(run, *layout_args)``), or a function of the run config returning one.
        layout_args: the ``RunLayout`` fields ``create_group(run, ...)`` takes after the run.
        receives_weights: it takes the actor's weight versions: weight sync chooses a
            transport for it and hands it each version
            (:func:`rltrain.kinds.registry.weight_receivers`); its worker has the rollout
            worker's ``setup_weight_sync`` / ``join_weight_sync`` / ``catch_up``, and the
            stage calling it passes what it was handed (``WeightHub.handed_to(name)``).
        fused: the fused worker hosts it (its stages run in the fused rank's one call, its
            own group is not started). The fused worker's components are a fixed list
            (:data:`rltrain.runners.fusion.FUSED_WORKER_HOSTS`: actor, rollout, reward); a
            placed component that says ``fused`` but is not in it stops ``placement.fuse``.
        built_when: whether a run builds its group (None: always).
        cpu_only: its processes use no accelerator: placed on nodes (``node_group: node``);
            a placement giving it devices is refused.
        serves_rollout: the generation calls it while it generates (tool workers): it does not
            stop ``placement.fuse`` and a fused run starts it beside the fused ranks.
        state_kinds: the state kinds its processes keep on their devices between stages (what
            ``placement.offload.<name>`` can move); ``kv_cache`` counts only where the
            generation engine reserves it (``kv_reserved``). None: not declared (its workers
            decide what they hold), so its policies are not checked against it.
    """

    name: str
    summary: str
    workers: Mapping[str, WorkerPath] = field(default_factory=dict)
    layout_args: tuple[str, ...] = ()
    receives_weights: bool = False
    fused: bool = False
    built_when: Callable[[Any], bool] | None = None
    cpu_only: bool = False
    serves_rollout: bool = False
    state_kinds: tuple[str, ...] | None = None

    def worker_path(self, runner: str, run: Any) -> str | None:
        """``module:Class`` of the worker a run of ``runner`` builds for it (None: none)."""
        path = self.workers.get(runner)
        return path(run) if callable(path) else path


#: A runner's stages: (stage, {component: the state kinds it uses while running}); ``*`` is
#: every state kind of the component.
Stages = tuple[tuple[str, Mapping[str, tuple[str, ...]]], ...]


@dataclass(frozen=True)
class RunnerKind:
    """One runner kind (the value of ``runner``).

    Attributes:
        name: the config value.
        summary: one line for the docs.
        entry: ``module:function`` ``(run, out_dir, layout) -> summary`` driving a run.
        required: the components every placement of it names.
        stages: the stages of one step and the state each component uses in them.
        language_model: its policy is a language model trained on token sequences (LoRA,
            token budgets, reward models, tokenised tasks, generation engines).
        steps_env: it steps simulators in an ``env`` component (gym tasks, pipeline stages).
        fusable: its actor, rollout and reward may fuse (``placement.fuse``).
        engine_notes: per engine role, why it runs only the engines that list it.
        overlap: the components whose stages run at the same time in a run (they share cores).
        pre_ray_components: ``module:function`` ``(run, components)`` raising ``ConfigError``
            for a placement or algorithm it cannot run; None: the reasoning checks.
        pre_ray_sizes: ``module:function`` ``(run, env_world, rollout_world, actor_world)``
            deriving its batch sizes; None: the reasoning derivation.
        env_spaces: ``module:function`` ``(env_id) -> spaces`` reading the simulator's
            observation and action sizes (``obs_dim``, ``action_dim``, ``action_kind``), which
            size a policy that is not a language model in the plan; None: no simulator.
        ended_fields: ``module:function`` ``(run, records, summary) -> fields``: its own
            summary fields over the steps a run that ended with an exception finished, as its
            runner writes them for a finished run; None: the shared fields only.
    """

    name: str
    summary: str
    entry: str
    required: tuple[str, ...]
    stages: Stages
    language_model: bool = False
    steps_env: bool = False
    fusable: bool = False
    engine_notes: Mapping[str, str] = field(default_factory=dict)
    overlap: Callable[[Any], tuple[frozenset[str], ...]] = lambda run: ()
    pre_ray_components: str | None = None
    pre_ray_sizes: str | None = None
    env_spaces: str | None = None
    ended_fields: str | None = None


def load(path: str) -> Any:
    """The object a ``module:attribute`` import string names (imported now, not before).

    Raises:
        ImportError / AttributeError: the module or the attribute does not exist.
    """
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)
