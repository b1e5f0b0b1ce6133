"""Keys set away from their defaults where the run would never read them: refused, naming the
key, why nothing reads it and the fix.

Each rule is a key, the setting that makes it unread, and what to do. A key still at its schema
default is never refused (presets set several at their defaults), so only a value the user or a
preset chose and nothing would use stops the run. A micro-batch size is refused only where the
config sets one for a component that is not placed (or a rule reward): the plan chooses the null
ones later, on a copy of the checked config, so a size it chose never comes through here.

Registered with :func:`rltrain.config.checks.check`; no torch, no Ray.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from rltrain.config.algorithms import (
    ADVANTAGE_ESTIMATORS,
    estimator_reads,
    is_group_based,
    needs_critic,
    option_readers,
)
from rltrain.config.checks import check
from rltrain.config.numerics import placed_components, resolve_old_logprobs
from rltrain.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    AutoPlacementConfig,
    ClusterConfig,
    CriticConfig,
    EnvConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SimulateConfig,
    ToolsConfig,
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
    rules += _placement_sections(cfg, kind)
    rules += _absent_micro_batches(cfg)
    rules += _engine_and_cluster(cfg, kind)
    rules += _targets(cfg, kind)
    return rules


def _placement_sections(cfg: RunConfig, kind: RunnerKind | None) -> list[Rule]:
    """``placement.auto.*`` outside placement=auto, and the critic's keys with none placed."""
    rules: list[Rule] = []
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
        rules.append(
            ("critic", _changed(cfg.critic, CriticConfig(), ("lr", "micro_batch_size")), why)
        )
    return rules


def _absent_micro_batches(cfg: RunConfig) -> list[Rule]:
    """Micro-batch sizes the config sets for a reference or inference component that is not
    placed, or for a rule reward (no model forward)."""
    placed = placed_components(cfg)
    rules: list[Rule] = []
    for name, fix in (
        ("reference", "algorithm.kl_coef>0 and +placement.component_placement.reference=..."),
        ("inference", "+placement.component_placement.inference=... (its own devices)"),
    ):
        size = getattr(cfg, name).micro_batch_size
        if name not in placed and size is not None:
            why = f"no {name} is placed (placement.component_placement): use {fix}, or drop it"
            rules.append((name, [("micro_batch_size", size)], why))
    if cfg.reward.kind == "rule":
        why = (
            "reward.kind='rule' scores with the task's reward function, no model forward: set "
            "reward.kind=model (with reward.model_path), or drop it"
        )
        rules.append(("reward", _changed(cfg.reward, RewardConfig(), ("micro_batch_size",)), why))
    return rules


def _engine_and_cluster(cfg: RunConfig, kind: RunnerKind | None) -> list[Rule]:
    """Keys of the generation engine, fusion, the Ray cluster and the trackers that the chosen
    engine, runner, cluster or tracker never reads."""
    rules: list[Rule] = []
    backend = cfg.rollout.backend
    if backend in registry.engine_names("generation"):
        if not registry.generation_engine(cfg).kv_reserved:
            reserving = ", ".join(registry.engine_names("generation", having="kv_reserved"))
            why = (
                f"rollout.backend={backend!r} reserves no share of device memory (its KV cache "
                f"is sized by the batch it generates): use an engine that does "
                f"({reserving}), or drop it"
            )
            names = ("gpu_memory_utilization",)
            rules.append(("rollout", _changed(cfg.rollout, RolloutConfig(), names), why))
    fuse = str(cfg.placement.fuse).lower()  # the command line's true arrives as 'True'
    if kind is not None and not kind.fusable and fuse == "true":
        why = (
            f"runner={cfg.runner!r} never fuses its actor and rollout (each keeps its own "
            f"processes): set placement.fuse=false, or drop it"
        )
        rules.append(("placement", [("fuse", fuse)], why))
    if cfg.cluster.address:
        why = (
            f"cluster.address={cfg.cluster.address!r} joins a running Ray cluster, whose temp "
            f"dir was chosen by `ray start --temp-dir`: drop it (or use cluster.address=null to "
            f"start a local Ray there)"
        )
        rules.append(("cluster", _changed(cfg.cluster, ClusterConfig(), ("temp_dir",)), why))
    lg = cfg.logging
    if not (lg.wandb or lg.mlflow):
        why = (
            "it names the W&B project or MLflow experiment, and neither tracker is on: set "
            "logging.wandb=true or logging.mlflow=true, or drop it"
        )
        rules.append(("logging", _changed(lg, LoggingConfig(), ("project",)), why))
    return rules


def _targets(cfg: RunConfig, kind: RunnerKind | None) -> list[Rule]:
    """A target that stops the run early, with no evaluation before the last step."""
    if kind is None or cfg.trainer.eval_every != 0:
        return []
    why = (
        "trainer.eval_every=0 evaluates only after the last step, so the target can never stop "
        "the run early: set trainer.eval_every>0, or drop it"
    )
    if kind.steps_env:
        return [("env", _changed(cfg.env, EnvConfig(), ("target_return",)), why)]
    return [("trainer", _changed(cfg.trainer, TrainerConfig(), ("target_accuracy",)), why)]


def _estimator_options(cfg: RunConfig) -> list[Rule]:
    """The algorithm options the chosen advantage estimator never reads."""
    a, a0 = cfg.algorithm, AlgorithmConfig()
    estimator = a.advantage_estimator
    rules: list[Rule] = []
    if not estimator_reads(estimator, "norm_adv_by_std"):
        readers = ", ".join(option_readers("norm_adv_by_std"))
        why = (
            f"algorithm.advantage_estimator={estimator!r} never divides by the group std (only "
            f"{readers} reads it): drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("norm_adv_by_std",)), why))
    if not estimator_reads(estimator, "gamma"):
        how = "scores whole responses" if is_group_based(estimator) else "does not discount"
        readers = " and ".join(option_readers("gamma"))
        why = (
            f"algorithm.advantage_estimator={estimator!r} {how}; only {readers} discount per "
            f"token: drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("gamma",)), why))
    if not estimator_reads(estimator, "lam"):
        readers = " and ".join(option_readers("lam"))
        why = (
            f"algorithm.advantage_estimator={estimator!r} has no lambda to mix returns by; it "
            f"is read only by {readers}: drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("lam",)), why))
    if not needs_critic(estimator):
        critics = " and ".join(n for n in ADVANTAGE_ESTIMATORS if needs_critic(n))
        why = (
            f"algorithm.advantage_estimator={estimator!r} trains no critic; it is read only by "
            f"{critics} (estimators with a critic): drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("value_clip", "value_coef")), why))
    return rules


def _language_runner(cfg: RunConfig, kind: RunnerKind | None) -> list[Rule]:
    if kind is None or not kind.language_model:
        return []
    a, a0 = cfg.algorithm, AlgorithmConfig()
    rules = _estimator_options(cfg)
    if a.kl_coef <= 0:
        why = (
            f"algorithm.kl_coef={a.kl_coef}: no KL to a reference is computed: set "
            f"algorithm.kl_coef>0, or leave it at its default (algorithm.kl_estimator="
            f"{a0.kl_estimator}, algorithm.kl_in={a0.kl_in})"
        )
        rules.append(("algorithm", _changed(a, a0, ("kl_estimator", "kl_in")), why))
    if resolve_old_logprobs(cfg) == "rollout":
        how = "" if a.old_logprobs == "rollout" else f"={a.old_logprobs!r}, which resolves to"
        why = (
            f"pi_old is the rollout's own log-probs (algorithm.old_logprobs{how} 'rollout' for "
            f"this run), so there is no ratio to the rollout to truncate: set "
            f"algorithm.old_logprobs=recompute, or drop it"
        )
        rules.append(("algorithm", _changed(a, a0, ("tis_cap",)), why))
    why = (
        f"env.* sets up the simulators of an embodied run; runner={cfg.runner!r} has none: "
        f"drop it (or use an embodied preset, experiment=cartpole_hybrid)"
    )
    names = tuple(f.name for f in dataclasses.fields(EnvConfig))
    rules.append(("env", _changed(cfg.env, EnvConfig(), names), why))
    if not kind.steps_env:
        why = (
            f"it models the env steps and the policy's inference of an embodied run; "
            f"runner={cfg.runner!r} steps no simulators: drop it"
        )
        rules.append(("simulate", _changed(cfg.simulate, SimulateConfig(), _ENV_LATENCIES), why))
    m = cfg.model
    if m.path or m.tokenizer_path:
        source = (
            f"model.tokenizer_path={m.tokenizer_path!r}"
            if m.tokenizer_path
            else f"model.path={m.path!r}"
        )
        why = (
            f"the tokenizer is {source}'s own; the alphabet is the built-in tokenizer's only: "
            f"drop it"
        )
        rules.append(("model", _changed(m, ModelConfig(), ("vocab_chars",)), why))
    return rules


#: ``simulate.*`` keys of the simulators and the embodied policy's inference.
_ENV_LATENCIES = (
    "env_step_latency_ms",
    "env_step_jitter_ms",
    "env_policy_latency_ms",
    "env_policy_jitter_ms",
)


#: What a runner that steps simulators reads of the language-model sections: its policy network
#: is ``model.hidden_size`` wide and ``model.num_layers`` deep, initialised from
#: ``model.init_seed``, and trains in float32 with no KL and its own rollout's log-probs as
#: pi_old; its batch is ``env.*``'s transitions.
_ENV_RUNNER_UNREAD = (
    ("model", ModelConfig(), tuple(
        f.name for f in dataclasses.fields(ModelConfig)
        if f.name not in ("hidden_size", "num_layers", "init_seed")
    )),
    ("rollout", RolloutConfig(),
     ("temperature", "top_p", "n_samples_per_prompt", "max_new_tokens")),
    ("algorithm", AlgorithmConfig(),
     ("norm_adv_by_std", "loss_agg", "kl_estimator", "kl_in", "tis_cap")),
    ("actor", ActorConfig(), ("micro_batch_size",)),
    ("trainer", TrainerConfig(), ("train_batch_size",)),
)  # fmt: skip

#: The multi-turn episodes' and tool calls' keys (``task.env``'s, a language runner's): a
#: runner that steps simulators runs no text episodes and calls no tools.
_ENV_RUNNER_NO_TOOLS = (
    ("rollout", RolloutConfig(), ("max_turns", "max_total_tokens")),
    ("simulate", SimulateConfig(), ("tool_latency_ms", "tool_failure_rate")),
    ("tools", ToolsConfig(), tuple(f.name for f in dataclasses.fields(ToolsConfig))),
)  # fmt: skip


def _env_runner(cfg: RunConfig, kind: RunnerKind | None) -> list[Rule]:
    if kind is None or not kind.steps_env:
        return []
    why = (
        f"runner={cfg.runner!r} acts with its own policy network (model.hidden_size, "
        f"model.num_layers; float32), samples its actions from the policy's distribution and "
        f"trains PPO, with no KL and its rollout's log-probs as pi_old, on the transitions env.* "
        f"sizes (minibatches: algorithm.num_minibatches): drop it"
    )
    rules = [
        (name, _changed(getattr(cfg, name), default, fields), why)
        for name, default, fields in _ENV_RUNNER_UNREAD
    ]
    why = (
        f"runner={cfg.runner!r} runs no multi-turn text episodes and calls no tools (those "
        f"are task.env's, which only a language-model runner reads): drop it"
    )
    rules += [
        (name, _changed(getattr(cfg, name), default, fields), why)
        for name, default, fields in _ENV_RUNNER_NO_TOOLS
    ]
    why = (
        f"runner={cfg.runner!r} makes no generate calls: it infers an action per env step "
        f"(modelled by simulate.env_policy_latency_ms): drop it"
    )
    names = ("rollout_latency_ms", "rollout_token_latency_ms")
    rules.append(("simulate", _changed(cfg.simulate, SimulateConfig(), names), why))
    transport = cfg.weight_sync.transport
    if transport in ("collective", "ipc"):
        why = (
            f"runner={cfg.runner!r} sends its policy's weights through the host (a small "
            f"network): set weight_sync.transport=host or auto"
        )
        rules.append(("weight_sync", [("transport", transport)], why))
    return rules


@check
def _unread(cfg: RunConfig) -> Iterator[str]:
    yield from unread_keys(cfg)
