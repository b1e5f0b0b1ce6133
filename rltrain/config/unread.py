"""Keys set away from their defaults where the run would never read them: refused, naming the
key, why nothing reads it and the fix.

Each rule is a key, the setting that makes it unread, and what to do. A key still at its schema
default is never refused (presets set several at their defaults), so only a value the user or a
preset chose and nothing would use stops the run. Micro-batch sizes of absent components are left
alone: the plan fills every null one itself.

Registered with :func:`rltrain.config.checks.check`; no torch, no Ray.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from rltrain.config.algorithms import is_group_based, needs_critic
from rltrain.config.checks import check
from rltrain.config.numerics import placed_components
from rltrain.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    AutoPlacementConfig,
    CriticConfig,
    EnvConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
)
from rltrain.kinds import registry
from rltrain.kinds.records import RunnerKind


def _changed(section: Any, default: Any, names: tuple[str, ...]) -> list[tuple[str, Any]]:
    """``(name, value)`` of the fields of ``section`` that differ from ``default``'s."""
    return [(n, getattr(section, n)) for n in names if getattr(section, n) != getattr(default, n)]


Rule = tuple[str, list[tuple[str, Any]], str]


def unread_keys(cfg: RunConfig) -> Iterator[str]:
    """Every key set where nothing reads it (see the module docstring)."""
    kind = registry.runner(cfg) if cfg.runner in registry.runner_names() else None
    rules = [*_any_runner(cfg, kind), *_language_runner(cfg, kind), *_env_runner(cfg, kind)]
    for section, changed, why in rules:
        for name, value in changed:
            yield f"{section}.{name}={value!r} is set but nothing reads it: {why}"


def _any_runner(cfg: RunConfig, kind: RunnerKind | None) -> list[Rule]:
    a, a0 = cfg.algorithm, AlgorithmConfig()
    rules: list[Rule] = []
    if a.overlong_buffer == 0:
        why = (
            "the penalty applies over algorithm.overlong_buffer tokens, which is 0: set "
            "algorithm.overlong_buffer>0 or drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("overlong_penalty",)), why))
    if not a.filter_groups:
        why = (
            "it bounds the rounds of algorithm.filter_groups, which is off: set "
            "algorithm.filter_groups=true or drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("max_generation_batches",)), why))
    if cfg.actor.lora.rank == 0:
        why = (
            "actor.lora.rank is 0 (the full model trains, no adapters): set actor.lora.rank>0 "
            "or drop it"
        )
        names = ("alpha", "dropout", "target_modules")
        rules.append(("actor.lora", _changed(cfg.actor.lora, LoraConfig(), names), why))
    auto, auto0 = cfg.placement.auto, AutoPlacementConfig()
    if cfg.placement.mode != "auto":
        why = (
            f"placement.auto.* configures placement=auto's profiling and search, and "
            f"placement.mode={cfg.placement.mode!r}: use placement=auto, or drop it"
        )
        names = tuple(f.name for f in dataclasses.fields(AutoPlacementConfig))
        rules.append(("placement.auto", _changed(auto, auto0, names), why))
    elif kind is not None and not kind.steps_env:
        why = (
            f"it lists env.pipeline_stage_num values for embodied runs, and runner="
            f"{cfg.runner!r} steps no simulators: drop it"
        )
        rules.append(("placement.auto", _changed(auto, auto0, ("pipeline_stages",)), why))
    if "critic" not in placed_components(cfg):
        if kind is not None and kind.steps_env:
            why = (
                f"runner={cfg.runner!r} trains its value head in the actor, at optimizer.lr: "
                f"drop it"
            )
        else:
            why = (
                "no critic is placed (placement.component_placement): use algorithm=ppo or an "
                "experiment=reasoning_ppo* preset, or drop it"
            )
        rules.append(("critic", _changed(cfg.critic, CriticConfig(), ("lr",)), why))
    return rules


def _language_runner(cfg: RunConfig, kind: RunnerKind | None) -> list[Rule]:
    if kind is None or not kind.language_model:
        return []
    a, a0 = cfg.algorithm, AlgorithmConfig()
    estimator = a.advantage_estimator
    rules: list[Rule] = []
    if is_group_based(estimator):
        why = (
            f"algorithm.advantage_estimator={estimator!r} scores whole responses; only "
            f"reinforce_pp and gae discount per token: drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("gamma",)), why))
    if not needs_critic(estimator):
        why = (
            f"only GAE with a critic (algorithm=ppo) reads it, and "
            f"algorithm.advantage_estimator={estimator!r}: drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("lam", "value_clip", "value_coef")), why))
    why = (
        f"env.* sets up the simulators of an embodied run; runner={cfg.runner!r} has none: "
        f"drop it (or use an embodied preset, experiment=cartpole_hybrid)"
    )
    names = tuple(f.name for f in dataclasses.fields(EnvConfig))
    rules.append(("env", _changed(cfg.env, EnvConfig(), names), why))
    return rules


#: What a runner that steps simulators reads of the language-model sections: its policy network
#: is ``model.hidden_size`` wide and ``model.num_layers`` deep, initialised from
#: ``model.init_seed``, and trains in float32; its batch is ``env.*``'s transitions.
_ENV_RUNNER_UNREAD = (
    ("model", ModelConfig(), tuple(
        f.name for f in dataclasses.fields(ModelConfig)
        if f.name not in ("hidden_size", "num_layers", "init_seed")
    )),
    ("rollout", RolloutConfig(),
     ("temperature", "top_p", "n_samples_per_prompt", "max_new_tokens")),
    ("algorithm", AlgorithmConfig(), ("norm_adv_by_std", "loss_agg")),
    ("actor", ActorConfig(), ("micro_batch_size",)),
    ("trainer", TrainerConfig(), ("train_batch_size",)),
)  # fmt: skip


def _env_runner(cfg: RunConfig, kind: RunnerKind | None) -> list[Rule]:
    if kind is None or not kind.steps_env:
        return []
    why = (
        f"runner={cfg.runner!r} acts with its own policy network (model.hidden_size, "
        f"model.num_layers; float32), samples its actions from the policy's distribution and "
        f"trains PPO on the transitions env.* sizes (minibatches: algorithm.num_minibatches): "
        f"drop it"
    )
    return [
        (name, _changed(getattr(cfg, name), default, fields), why)
        for name, default, fields in _ENV_RUNNER_UNREAD
    ]


@check
def _unread(cfg: RunConfig) -> Iterator[str]:
    yield from unread_keys(cfg)
