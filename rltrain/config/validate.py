"""Turn a composed Hydra config into a checked :class:`RunConfig`.

OmegaConf already refuses unknown keys and wrong types while composing (the primary config sits
on the schema). Here come the checks that need more than one field; they are all run and
reported together, each naming the full key, the bad value and the fix.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, ValidationError

from rltrain.config.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGS,
    POLICY_LOSSES,
    group_estimators,
    is_group_based,
    needs_critic,
)
from rltrain.config.checks import CHECKS, check
from rltrain.config.files import (
    POLICY_HEADS,
    built_field_problems,
    checkpoint_dir_owner_problems,
    checkpoint_dir_problems,
    checkpoint_problems,
    inputs_in_checkpoint_dir,
)
from rltrain.config.offload import policy_config, resolve_offload
from rltrain.config.schema import (
    DISPATCHES,
    MODEL_SIZE_FIELDS,
    SAMPLERS,
    ModelConfig,
    RunConfig,
    WhatifConfig,
)
from rltrain.errors import ConfigError, import_user_module
from rltrain.kinds import registry
from rltrain.kinds.records import RunnerKind

#: The estimator names, and those that compare the samples of a prompt (the vocabulary's).
ESTIMATORS = tuple(ADVANTAGE_ESTIMATORS)


def load_config(cfg: DictConfig | dict[str, Any] | RunConfig) -> RunConfig:
    """Check a composed config and return it as a :class:`RunConfig`.

    Args:
        cfg: the composed config (a DictConfig from Hydra, a plain dict, or a RunConfig).

    Returns:
        The config as dataclass objects.

    Raises:
        ConfigError: listing every missing key and every failed cross-field check.
    """
    run, problems = check_config(cfg)
    if problems:
        raise ConfigError(problems)
    return run


def check_config(cfg: DictConfig | dict[str, Any] | RunConfig) -> tuple[RunConfig, list[str]]:
    """:func:`load_config`, returning the cross-field problems instead of raising them (so a
    caller can add the problems of later checks to the same report).

    Returns:
        ``(run, problems)``: the config as dataclass objects, and every cross-field problem.

    Raises:
        ConfigError: the config cannot be built at all (an unresolvable interpolation, a value
            of the wrong type, a required key without a value).
    """
    if isinstance(cfg, RunConfig):
        run = cfg
    else:
        # A plain, resolved copy: Hydra's `+key=value` may have opened a typed node, and
        # workers on other processes cannot resolve `${hydra:...}` interpolations.
        try:
            plain = (
                OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
            )
        except InterpolationResolutionError as exc:
            key = getattr(exc, "full_key", None) or "?"
            first = str(exc.msg if hasattr(exc, "msg") else exc).splitlines()[0]
            raise ConfigError(
                f"{key} could not be resolved ({first}): the key it refers to is missing; "
                f"set that key, or give {key} a value of its own"
            ) from None
        try:
            node = OmegaConf.merge(OmegaConf.structured(RunConfig), plain)
        except (ConfigKeyError, ValidationError) as exc:
            from rltrain.config.errors import explain

            raise ConfigError(explain(exc) or str(exc)) from None
        missing = sorted(OmegaConf.missing_keys(node))
        if missing:
            raise ConfigError(
                [
                    f"{k} is required but has no value: set it in its config group or as {k}=..."
                    for k in missing
                ]
            )
        run = OmegaConf.to_object(node)
    problems = _typed_offload(run)
    problems += [p for c in CHECKS for p in c(run)]
    return run, problems


def _typed_offload(run: RunConfig) -> list[str]:
    """Turn each ``placement.offload`` mapping into its record (see the schema's comment)."""
    problems, typed = [], {}
    for name, policy in run.placement.offload.items():
        try:
            typed[name] = policy_config(policy, f"placement.offload.{name}")
        except ConfigError as exc:
            problems += exc.problems
            typed[name] = None
    run.placement.offload = typed
    return problems


def _runner_kind(cfg: RunConfig) -> RunnerKind | None:
    """The run's runner kind; None for an unknown ``runner`` (reported once, by ``_run``)."""
    if cfg.runner not in registry.runner_names():
        return None
    return registry.runner(cfg)


def _one_of(key: str, value: Any, options: tuple[str, ...]) -> Iterator[str]:
    if value not in options:
        yield f"{key}={value!r} is not valid: choose one of {list(options)}"


def _positive(key: str, value: float, zero_ok: bool = False) -> Iterator[str]:
    if not math.isfinite(value):
        return  # reported once, by _finite
    if value < 0 or (value == 0 and not zero_ok):
        yield f"{key}={value!r} must be {'>= 0' if zero_ok else '> 0'}"


def _within(key: str, value: float, low: float, high: float, why: str = "") -> Iterator[str]:
    """Refuse a finite value outside ``[low, high]``."""
    if math.isfinite(value) and not low <= value <= high:
        yield f"{key}={value!r} must be in [{low:g}, {high:g}]{why}"


#: No real cluster has more devices than this: larger sizes are typing mistakes, refused before
#: anything tries to plan (or allocate) them.
MAX_DEVICES = 100_000
#: Seeds feed torch, NumPy and Python's random: all take 32-bit values.
SEED_LIMIT = 2**32
#: Integers beyond this cannot be any real count, size or step.
INT_LIMIT = 2**53


def _fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(full key, value)`` of every leaf of a config record, lists and mappings included."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _fields(getattr(obj, f.name), f"{prefix}{f.name}.")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _fields(v, f"{prefix}{k}.")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _fields(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], obj


@check
def _finite(cfg: RunConfig) -> Iterator[str]:
    """No NaN or infinity anywhere, and no integer beyond any real count."""
    for key, value in _fields(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            yield f"{key}={value!r} must be a finite number"
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
            yield f"{key}={value} is beyond any real size (|value| <= 2**53): fix the number"


@check
def _run(cfg: RunConfig) -> Iterator[str]:
    yield from _one_of("mode", cfg.mode, ("train", "plan"))
    yield from _one_of("runner", cfg.runner, registry.runner_names())
    for key, seed in (
        ("seed", cfg.seed),
        ("task.seed", cfg.task.seed),
        ("model.init_seed", cfg.model.init_seed),
    ):
        if not 0 <= seed < SEED_LIMIT:
            yield f"{key}={seed} must be in [0, 2**32): torch, NumPy and random take 32-bit seeds"


#: The trackers ``logging.<key>=true`` turns on: key -> (module, how to install it).
TRACKERS = {
    "tensorboard": ("tensorboard", "pip install 'rltrain[track]' (or pip install tensorboard)"),
    "wandb": ("wandb", "pip install 'rltrain[track]' (or pip install wandb)"),
    "mlflow": ("mlflow", "pip install 'rltrain[track]' (or pip install mlflow)"),
}


def tracker_problems(logging_cfg: Any) -> list[str]:
    """An enabled tracker that is not installed, naming ``logging.<tracker>`` and the fix."""
    return [
        f"logging.{key}=true but {module} is not installed: {fix}"
        for key, (module, fix) in TRACKERS.items()
        if getattr(logging_cfg, key, False) and importlib.util.find_spec(module) is None
    ]


@check
def _trackers(cfg: RunConfig) -> Iterator[str]:
    """Trackers a training run logs to are installed (checked with the config, so a sweep's
    launcher and ``placement=auto`` refuse before profiling or starting Ray); a plan logs
    nothing."""
    if cfg.mode == "train":
        yield from tracker_problems(cfg.logging)


@check
def _cluster(cfg: RunConfig) -> Iterator[str]:
    c = cfg.cluster
    if c.num_nodes < 1:
        # the cluster's own check words it so (rltrain.placement.types): said once, with a fix
        yield (
            f"cluster.num_nodes={c.num_nodes!r} is not a whole number >= 1: set "
            f"cluster.num_nodes to an integer >= 1"
        )
    if c.device_memory_gib is not None:
        yield from _positive("cluster.device_memory_gib", c.device_memory_gib)
    yield from _positive("cluster.startup_timeout_s", c.startup_timeout_s)
    yield from _positive("cluster.collective_timeout_s", c.collective_timeout_s)
    yield from _one_of("cluster.node_order", c.node_order, ("head_first", "ip", "label"))
    d = c.devices_per_node
    if isinstance(d, list):
        if len(d) != c.num_nodes:
            yield (
                f"cluster.devices_per_node has {len(d)} entries but cluster.num_nodes="
                f"{c.num_nodes}: give one entry per node, or a single int for all nodes"
            )
        if any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in d):
            yield f"cluster.devices_per_node={d!r} must hold non-negative integers"
    elif not isinstance(d, int) or isinstance(d, bool) or d < 0:
        yield f"cluster.devices_per_node={d!r} must be a non-negative integer or a list of them"
    else:
        d = [d] * max(min(c.num_nodes, MAX_DEVICES + 1), 0)
    if isinstance(d, list) and all(isinstance(x, int) for x in d):
        total = sum(d)
        if total > MAX_DEVICES or c.num_nodes > MAX_DEVICES:
            yield (
                f"cluster.num_nodes={c.num_nodes} x cluster.devices_per_node="
                f"{c.devices_per_node} is beyond any real cluster (at most {MAX_DEVICES:,} "
                f"devices): give the nodes and devices per node this job should use"
            )
    if (
        c.num_nodes >= 1
        and isinstance(d, list)
        and all(isinstance(x, int) for x in d)
        and sum(d) == 0
    ):
        yield from _deviceless(cfg)
    if c.cpus_per_node is not None:
        yield from _positive("cluster.cpus_per_node", c.cpus_per_node)
    if c.host_memory_gib is not None:
        yield from _positive("cluster.host_memory_gib", c.host_memory_gib)
    yield from _node_group_labels([g.label for g in c.node_groups])


def _node_group_labels(labels: list[str]) -> Iterator[str]:
    """``cluster.node_groups`` labels: unique, and not the placement's own words."""
    for label in labels:
        if label in ("cluster", "node"):
            yield f"cluster.node_groups label {label!r} is reserved: choose another label"
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        yield f"cluster.node_groups labels {dup} are used twice: labels must be unique"


def _deviceless(cfg: RunConfig) -> Iterator[str]:
    """Components placed on devices of a cluster that has none."""
    on_devices = device_placement_keys(cfg)
    if on_devices:
        yield (
            f"cluster.devices_per_node={cfg.cluster.devices_per_node!r} gives the cluster no "
            f"devices, but placement.component_placement puts {on_devices} on devices: set "
            f"cluster.devices_per_node to at least 1 (simulated devices on a machine without "
            f"GPUs), or place them on a node group ({{node_group: node, placement: '0'}})"
        )


@check
def _placement(cfg: RunConfig) -> Iterator[str]:
    p = cfg.placement
    if p.mode is not None:
        yield from _one_of(
            "placement.mode", p.mode, ("collocated", "disaggregated", "hybrid", "auto")
        )
    # placement.auto.* is checked whatever the mode: a bad value is wrong before it is used
    yield from auto_problems(p.auto, writes=p.mode == "auto" and cfg.mode == "train")
    if not p.component_placement:
        yield "placement.component_placement is empty: place at least the actor, e.g. actor: all"
    for key in p.component_placement:
        for name in str(key).split(","):
            if name.strip() not in registry.component_names():
                yield (
                    f"placement.component_placement names unknown component {name.strip()!r} "
                    f"(in key {key!r}): components are {list(registry.component_names())}"
                )
    yield from _one_of("placement.fuse", str(p.fuse).lower(), ("auto", "true", "false"))
    for name, policy in p.offload.items():
        if name not in registry.component_names():
            names = list(registry.component_names())
            yield f"placement.offload.{name}: unknown component; components are {names}"
            continue
        try:
            resolve_offload(policy, f"placement.offload.{name}")
        except ConfigError as e:
            yield from e.problems


AUTO_FAMILIES = ("collocated", "disaggregated", "hybrid")


def auto_problems(a: Any, writes: bool = False) -> Iterator[str]:
    """``placement.auto.*`` (placement=auto), each problem with the key and the fix.

    Args:
        a: the ``placement.auto`` section (an ``AutoPlacementConfig``); None yields nothing.
        writes: the profiles will be written to ``placement.auto.cache_dir`` (a training run
            of ``placement=auto``): the directory must be writable.
    """
    if a is None:
        return
    if writes and a.cache_dir:
        for problem in checkpoint_dir_problems(
            a.cache_dir, probe=True, key="placement.auto.cache_dir"
        ):
            yield problem.replace(
                "point placement.auto.cache_dir at a writable directory",
                "point placement.auto.cache_dir at a writable directory (null: "
                "~/.cache/rltrain/profiles)",
            )
    if a.profile_steps < 2:
        yield (
            f"placement.auto.profile_steps={a.profile_steps}: profiling needs >= 2 steps (the "
            f"first is warm-up and not timed); use 4"
        )
    yield from _positive("placement.auto.time_limit_s", a.time_limit_s)
    if not a.candidates or any(c not in AUTO_FAMILIES for c in a.candidates):
        yield (
            f"placement.auto.candidates={list(a.candidates)}: give a non-empty subset of "
            f"{list(AUTO_FAMILIES)}"
        )
    if not a.staleness or any(k not in (0, 1) for k in a.staleness):
        yield (
            f"placement.auto.staleness={list(a.staleness)}: give a non-empty subset of [0, 1] "
            f"(trainer.max_staleness values to try)"
        )
    policies = getattr(a, "partial_rollout", None)
    if policies is not None and (
        not policies
        or any(x not in ("finish", "continue", "restart", "carry") for x in policies)
        or len(set(policies)) != len(policies)
    ):
        yield (
            f"placement.auto.partial_rollout={list(policies)}: give distinct values from "
            f"['finish', 'continue', 'restart', 'carry'] (trainer.partial_rollout policies to "
            f"try; carry runs at max_staleness=2), or null for [finish, continue]"
        )
    if any(n < 1 for n in a.pipeline_stages):
        yield (
            f"placement.auto.pipeline_stages={list(a.pipeline_stages)}: stage counts are >= 1; "
            f"leave it empty for the defaults"
        )
    yield from _positive("placement.auto.max_checked", a.max_checked)
    yield from _positive("placement.auto.profile_passes", a.profile_passes)


@check
def auto_choice_problems(cfg: RunConfig) -> Iterator[str]:
    """Keys placement=auto would otherwise accept and not use: what each candidate sets itself
    (``trainer.max_staleness``, ``placement.fuse=true``) or what its ranking does not read
    (``whatif.steps``). Each names the key, the value and the fix."""
    if cfg.placement.mode != "auto":
        return
    if cfg.trainer.max_staleness != 0:
        yield (
            f"trainer.max_staleness={cfg.trainer.max_staleness} with placement=auto: each "
            f"candidate sets its own from placement.auto.staleness (carry candidates run at "
            f"2); drop trainer.max_staleness, set placement.auto.staleness=[1] "
            f"placement.auto.candidates=[disaggregated] to try only asynchronous layouts, or "
            f"choose the layout yourself (placement=disaggregated "
            f"trainer.max_staleness={cfg.trainer.max_staleness})"
        )
    if str(cfg.placement.fuse).lower() == "true":
        yield (
            "placement.fuse=true with placement=auto: only one candidate could fuse (actor and "
            "rollout collocated on every device), so there is nothing to choose; set "
            "placement.fuse=auto (fused and taking-turns candidates), placement.fuse=false (no "
            "fused candidate), or placement=collocated placement.fuse=true to run fused"
        )
    steps = cfg.whatif.steps
    if steps != WhatifConfig.steps:
        yield (
            f"whatif.steps={steps} with placement=auto: whatif.steps sets the steps of a "
            f"configured layout's prediction, and placement=auto predicts none (its simulator "
            f"column simulates each candidate for as many steps as mode=plan's ranking does); "
            f"drop whatif.steps"
        )


@check
def _model(cfg: RunConfig) -> Iterator[str]:
    m = cfg.model
    yield from _one_of("model.dtype", m.dtype, ("float32", "bfloat16", "float16"))
    yield from _one_of("model.family", m.family, ("llama", "qwen2"))
    generated = bool(cfg.task.generate)  # the generator writes model.path, built from the fields
    if m.path is not None and not generated:
        if not os.path.isdir(m.path):
            yield (
                f"model.path={m.path!r} does not exist or is not a directory: give a local "
                f"Hugging Face checkpoint directory, or model.path=null to build the tiny model"
            )
        elif not os.path.isfile(os.path.join(m.path, "config.json")):
            yield (
                f"model.path={m.path!r} has no config.json, so it is not a Hugging Face "
                f"checkpoint: point it at the directory that holds config.json"
            )
        else:
            yield from checkpoint_problems("model.path", m.path, POLICY_HEADS)
            # a building field beside a checkpoint would be ignored unless it describes it
            yield from built_field_problems(m.path, vars(m), vars(ModelConfig()))
    if m.vocab_size is not None:
        yield from _positive("model.vocab_size", m.vocab_size)
    if m.tokenizer_path is not None and not os.path.isdir(m.tokenizer_path):
        yield f"model.tokenizer_path={m.tokenizer_path!r} is not a directory"
    if m.vocab_chars is not None and (
        not m.vocab_chars or len(set(m.vocab_chars)) < len(m.vocab_chars)
    ):
        yield (
            f"model.vocab_chars={m.vocab_chars!r} must be a non-empty string without repeated "
            f"characters (each becomes one token of the built-in tokenizer): list the "
            f"characters, or model.vocab_chars=null for the default alphabet"
        )
    if m.path is None or generated:
        for key in MODEL_SIZE_FIELDS:
            yield from _positive(f"model.{key}", getattr(m, key))
        if m.num_heads > 0 and m.hidden_size % m.num_heads:
            yield (
                f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads="
                f"{m.num_heads}: pick sizes where hidden_size % num_heads == 0"
            )
        if m.num_kv_heads > 0 and m.num_heads % m.num_kv_heads:
            yield f"model.num_heads={m.num_heads} is not divisible by model.num_kv_heads"


@check
def _algorithm(cfg: RunConfig) -> Iterator[str]:
    a = cfg.algorithm
    yield from _one_of("algorithm.advantage_estimator", a.advantage_estimator, ESTIMATORS)
    yield from _one_of("algorithm.policy_loss", a.policy_loss, tuple(POLICY_LOSSES))
    yield from _one_of("algorithm.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
    yield from _one_of("algorithm.kl_in", a.kl_in, ("loss", "reward"))
    yield from _one_of("algorithm.loss_agg", a.loss_agg, LOSS_AGGS)
    yield from _positive("algorithm.kl_coef", a.kl_coef, zero_ok=True)
    yield from _within(
        "algorithm.clip_low", a.clip_low, 0, 0.999, ": the ratio is clipped below at 1 - clip_low"
    )
    yield from _positive("algorithm.clip_high", a.clip_high, zero_ok=True)
    yield from _positive("algorithm.entropy_coef", a.entropy_coef, zero_ok=True)
    yield from _positive("algorithm.value_clip", a.value_clip, zero_ok=True)
    yield from _positive("algorithm.value_coef", a.value_coef, zero_ok=True)
    yield from _within("algorithm.gamma", a.gamma, 0, 1, " (a discount)")
    yield from _within("algorithm.lam", a.lam, 0, 1, " (GAE's lambda)")
    yield from _positive("algorithm.ppo_epochs", a.ppo_epochs)
    yield from _positive("algorithm.num_minibatches", a.num_minibatches)
    n = cfg.rollout.n_samples_per_prompt
    if n < 1:
        yield f"rollout.n_samples_per_prompt={n} must be >= 1"
    elif is_group_based(a.advantage_estimator) and n < 2:
        yield (
            f"rollout.n_samples_per_prompt={n} with algorithm.advantage_estimator="
            f"{a.advantage_estimator!r}: a group-based estimator compares samples of one prompt, "
            f"so set rollout.n_samples_per_prompt>=2 or use reinforce_pp / gae"
        )
    placed = {n.strip() for k in cfg.placement.component_placement for n in str(k).split(",")}
    kind = _runner_kind(cfg)
    language = kind is not None and kind.language_model
    if needs_critic(a.advantage_estimator) and language and "critic" not in placed:
        yield (
            f"algorithm.advantage_estimator={a.advantage_estimator!r} needs a critic, but "
            "placement.component_placement places none: use experiment=reasoning_ppo (or "
            "reasoning_ppo_hybrid / reasoning_ppo_disaggregated), add one with "
            "+placement.component_placement.critic=all, or use grpo/rloo"
        )


@check
def _batch_shaping(cfg: RunConfig) -> Iterator[str]:
    """DAPO's dynamic sampling and overlong handling (``rltrain/algorithms/shaping.py``)."""
    a = cfg.algorithm
    yield from _positive("algorithm.max_generation_batches", a.max_generation_batches)
    yield from _positive("algorithm.overlong_penalty", a.overlong_penalty, zero_ok=True)
    budget = cfg.rollout.max_new_tokens
    if not 0 <= a.overlong_buffer <= budget:
        yield (
            f"algorithm.overlong_buffer={a.overlong_buffer} must be in [0, {budget}] "
            f"(rollout.max_new_tokens): the penalty ramps over the last tokens of the budget"
        )
    if a.overlong_buffer > 0 and cfg.task.env is not None:
        # the shaping reads one response against one turn's budget; an episode's response is
        # several turns and the tool results between them
        yield (
            f"algorithm.overlong_buffer={a.overlong_buffer} with task.env={cfg.task.env!r}: "
            f"DAPO's overlong shaping measures a response against rollout.max_new_tokens, and "
            f"a multi-turn episode's response holds every turn and tool result; set "
            f"algorithm.overlong_buffer=0 (algorithm.mask_truncated=true still drops the "
            f"episodes the budget cut)"
        )
    used = [k for k, on in _shaping_keys(a) if on]
    if cfg.runner != "reasoning" and used:
        yield (
            f"{', '.join(used)} shape token responses; runner={cfg.runner!r} trains on "
            f"environment steps: leave them at their defaults"
        )
    if not a.filter_groups:
        return
    if not is_group_based(a.advantage_estimator):
        yield (
            f"algorithm.filter_groups=true with algorithm.advantage_estimator="
            f"{a.advantage_estimator!r}: only group estimators {list(group_estimators())} have "
            f"prompt groups to filter"
        )
    if cfg.trainer.max_staleness > 0:
        yield (
            f"algorithm.filter_groups=true with trainer.max_staleness="
            f"{cfg.trainer.max_staleness}: dynamic sampling generates until the step's batch is "
            f"full, which the synchronous schedule does; set trainer.max_staleness=0"
        )
    if str(cfg.placement.fuse).lower() == "true":
        yield (
            "algorithm.filter_groups=true with placement.fuse=true: a fused rank trains on the "
            "groups it generated and cannot wait for others; set placement.fuse=false or auto"
        )


def _shaping_keys(a: Any) -> list[tuple[str, bool]]:
    return [
        ("algorithm.filter_groups", a.filter_groups),
        ("algorithm.overlong_buffer", a.overlong_buffer > 0),
        ("algorithm.mask_truncated", a.mask_truncated),
    ]


OPTIMIZERS = ("adamw", "deepspeed_adamw")


@check
def _optimizer(cfg: RunConfig) -> Iterator[str]:
    o = cfg.optimizer
    yield from _one_of("optimizer.name", o.name, OPTIMIZERS)
    if o.name == "deepspeed_adamw" and cfg.actor.backend != "deepspeed":
        yield (
            "optimizer.name='deepspeed_adamw' is DeepSpeed's own Adam: use it with "
            "actor.backend=deepspeed, or optimizer.name=adamw"
        )
    yield from _positive("optimizer.lr", o.lr)
    if len(o.betas) != 2:
        yield f"optimizer.betas={list(o.betas)} must hold two numbers, e.g. [0.9, 0.999]"
    for i, b in enumerate(o.betas):
        if math.isfinite(b) and not 0 <= b < 1:
            yield f"optimizer.betas[{i}]={b} must be in [0, 1)"
    yield from _positive("optimizer.eps", o.eps)
    yield from _positive("optimizer.weight_decay", o.weight_decay, zero_ok=True)
    yield from _positive("optimizer.grad_clip", o.grad_clip, zero_ok=True)
    yield from _positive("optimizer.warmup_steps", o.warmup_steps, zero_ok=True)
    yield from _positive("critic.lr", cfg.critic.lr)


@check
def _components(cfg: RunConfig) -> Iterator[str]:
    yield from _one_of("actor.backend", cfg.actor.backend, registry.engine_names("training"))
    yield from _one_of("rollout.backend", cfg.rollout.backend, registry.engine_names("generation"))
    for comp in ("actor", "rollout", "inference"):
        for size in ("tensor_parallel_size", "pipeline_parallel_size"):
            yield from _positive(f"{comp}.{size}", getattr(getattr(cfg, comp), size))
    for key in (
        "actor.micro_batch_size",
        "reference.micro_batch_size",
        "critic.micro_batch_size",
        "inference.micro_batch_size",
        "reward.micro_batch_size",
    ):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value is not None:  # null: chosen by the plan
            yield from _positive(key, value)
    yield from _token_budget(cfg)
    for key in dataclasses.fields(cfg.simulate):
        yield from _positive(f"simulate.{key.name}", getattr(cfg.simulate, key.name), zero_ok=True)
    yield from modelled_length_problems(cfg)
    if cfg.actor.zero_stage not in (0, 1, 2, 3):
        yield f"actor.zero_stage={cfg.actor.zero_stage} must be 0, 1, 2 or 3"
    r = cfg.rollout
    yield from _positive("rollout.temperature", r.temperature)
    yield from _positive("rollout.max_new_tokens", r.max_new_tokens)
    if not 0 < r.top_p <= 1:
        yield f"rollout.top_p={r.top_p} must be in (0, 1]"
    if not 0 < r.gpu_memory_utilization <= 1:
        yield f"rollout.gpu_memory_utilization={r.gpu_memory_utilization} must be in (0, 1]"
    if r.max_model_len is not None:
        yield from _positive("rollout.max_model_len", r.max_model_len)
    yield from _one_of(
        "weight_sync.transport", cfg.weight_sync.transport, ("auto", "host", "collective", "ipc")
    )
    yield from _one_of("reward.kind", cfg.reward.kind, ("rule", "model"))
    if cfg.reward.kind == "model" and not cfg.reward.model_path:
        yield "reward.kind='model' needs reward.model_path: a local reward-model checkpoint"
    yield from _env(cfg)
    yield from dispatch_problems(cfg)


def _token_budget(cfg: RunConfig) -> Iterator[str]:
    """``actor.max_tokens_per_micro_batch`` must hold one full-length row (a longer row could
    not be trained at all) and applies to token sequences only."""
    budget = cfg.actor.max_tokens_per_micro_batch
    if budget is None:
        return
    key = "actor.max_tokens_per_micro_batch"
    row = cfg.task.max_prompt_length + cfg.rollout.max_new_tokens
    kind = _runner_kind(cfg)
    if kind is not None and not kind.language_model:
        yield (
            f"{key}={budget} applies to token sequences; runner={cfg.runner} trains on environment "
            f"steps: set it to null"
        )
    elif budget <= 0:
        yield (
            f"{key}={budget} must be > 0 (padded tokens per forward/backward), or null for "
            f"micro-batches of actor.micro_batch_size rows"
        )
    elif budget < row:
        yield (
            f"{key}={budget} is smaller than one full-length row, task.max_prompt_length + "
            f"rollout.max_new_tokens = {cfg.task.max_prompt_length} + "
            f"{cfg.rollout.max_new_tokens} = {row} tokens: set it to at least {row} (a few "
            f"times that lets short rows share a micro-batch), or null"
        )


def _env(cfg: RunConfig) -> Iterator[str]:
    e = cfg.env
    yield from _positive("env.num_envs", e.num_envs)
    yield from _positive("env.pipeline_stage_num", e.pipeline_stage_num)
    yield from _positive("env.rollout_steps", e.rollout_steps)
    yield from _positive("env.eval_episodes", e.eval_episodes)
    if not 0 <= e.lr_final_fraction <= 1:
        yield f"env.lr_final_fraction={e.lr_final_fraction} must be in [0, 1]"
    if e.pipeline_stage_num > 0 and e.num_envs % e.pipeline_stage_num:
        yield (
            f"env.num_envs={e.num_envs} is not divisible by env.pipeline_stage_num="
            f"{e.pipeline_stage_num}: every pipeline stage holds the same number of environments"
        )


def _importable(key: str, spec: str) -> Iterator[str]:
    """Refuse a ``module:function`` spec whose module cannot be imported or lacks the callable."""
    module_name, _, attr = spec.partition(":")
    try:
        module = import_user_module(key, spec, module_name)
    except ImportError as exc:
        yield f"{key}={spec!r}: cannot import module {module_name!r} ({exc}); fix the name"
        return
    except ConfigError as exc:
        yield str(exc)
        return
    fn = getattr(module, attr, None)
    if not callable(fn):
        yield f"{key}={spec!r}: module {module_name!r} has no callable {attr!r}"
        return
    problem = reward_signature_problem(key, spec, fn)
    if problem:
        yield problem


def reward_signature_problem(key: str, spec: str, fn: Callable[..., Any]) -> str:
    """Why ``fn`` cannot be called as a reward, ``fn(prompt, response, answer)`` ("" if it can).

    Bound against its signature, so nothing is called; a callable without a readable
    signature (some built-ins) passes here and is called when the task is checked.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return ""
    try:
        signature.bind("prompt", "response", "answer")
    except TypeError as exc:
        name = spec.partition(":")[2] or "reward"
        return (
            f"{key}={spec!r} cannot be called as a reward, {name}(prompt, response, answer) "
            f"({exc}; its signature is {name}{signature}): give a function "
            f"def {name}(prompt: str, response: str, answer: str) -> float"
        )
    return ""


@check
def _task(cfg: RunConfig) -> Iterator[str]:
    t = cfg.task
    yield from _one_of("task.name", t.name, ("arithmetic", "jsonl", "gym"))
    if t.name == "jsonl":
        if not t.path:
            yield (
                "task.name='jsonl' needs task.path: a local .jsonl, .json or .parquet file or a "
                "datasets.save_to_disk directory"
            )
        elif t.generate is None and not os.path.exists(t.path):
            yield (
                f"task.path={t.path!r} does not exist: give a local .jsonl, .json or .parquet "
                f"file or a datasets.save_to_disk directory"
            )
    yield from _unread_task_keys(t)
    yield from _positive("task.max_prompt_length", t.max_prompt_length)
    yield from _positive("task.num_train", t.num_train, zero_ok=True)
    yield from _positive("task.num_eval", t.num_eval, zero_ok=True)
    if t.reward_fn is not None and ":" not in t.reward_fn:
        yield (f"task.reward_fn={t.reward_fn!r} must look like 'package.module:function'")
    elif t.reward_fn is not None:
        yield from _importable("task.reward_fn", t.reward_fn)
    kind = _runner_kind(cfg)
    if kind is not None and kind.steps_env and t.name != "gym":
        yield (
            f"runner={cfg.runner!r} needs task.name='gym' (got {t.name!r}): use an experiment "
            f"preset"
        )
    if kind is not None and not kind.steps_env and t.name == "gym":
        envs = [n for n in registry.runner_names() if registry.runner(n).steps_env]
        yield f"task.name='gym' needs runner={' | '.join(envs)}"


@check
def _prompt_loop_keys(cfg: RunConfig) -> Iterator[str]:
    """Keys of the reasoning runner's prompt loop that a simulator runner would ignore: its
    steps are synchronous (stages overlap through ``env.pipeline_stage_num``) and it stops on
    ``env.target_return``."""
    kind = _runner_kind(cfg)
    if kind is None or not kind.steps_env:
        return
    t = cfg.trainer
    unread = (
        ("trainer.max_staleness", t.max_staleness, t.max_staleness != 0, "0",
         "its steps are synchronous; env.pipeline_stage_num overlaps the simulators with the "
         "rollout"),
        ("trainer.partial_rollout", t.partial_rollout, t.partial_rollout != "finish", "finish",
         "no generation runs at a weight swap"),
        ("trainer.target_accuracy", t.target_accuracy, t.target_accuracy is not None, "null",
         "it stops early on env.target_return (the greedy mean return), not on accuracy"),
    )  # fmt: skip
    for key, value, hit, ok, why in unread:
        if hit:
            yield f"{key}={value!r} with runner={cfg.runner!r}: {why}; set {key}={ok}"


def _unread_task_keys(t: Any) -> Iterator[str]:
    """Keys the chosen task would ignore: a data file given to a task that generates its
    prompts (the run would train the built-in task instead), and the other way round."""
    from rltrain.config.schema import TaskConfig

    defaults = TaskConfig()
    if t.name in ("arithmetic", "gym"):
        makes = "generates its own prompts" if t.name == "arithmetic" else "runs an environment"
        for key in ("path", "eval_path"):
            value = getattr(t, key)
            if value:
                yield (
                    f"task.{key}={value!r} is read by task.name=jsonl, but task.name="
                    f"{t.name!r} {makes} and would train on that instead: add task.name=jsonl "
                    f"to train on the file, or drop task.{key}"
                )
        for key in ("prompt_key", "answer_key"):
            value = getattr(t, key)
            if value != getattr(defaults, key):
                fix = "add task.name=jsonl task.path=..., or " if t.name == "arithmetic" else ""
                yield (
                    f"task.{key}={value!r} names a field of a data file (task.name=jsonl); "
                    f"task.name={t.name!r} has none: {fix}drop task.{key}"
                )
    yield from _unread_by_gym(t, defaults)
    if t.name != "jsonl" and t.params:
        yield (
            f"task.params={dict(t.params)!r} sets a data generator (task.generate, which writes "
            f"task.name=jsonl data); task.name={t.name!r} reads none of it: drop "
            + " ".join(f"task.params.{k}" for k in t.params)
            + (" (task.max_operand sizes the arithmetic task)" if t.name == "arithmetic" else "")
        )
    if t.name != "gym" and t.env_id != defaults.env_id:
        yield (
            f"task.env_id={t.env_id!r} picks a Gymnasium environment for task.name='gym'; "
            f"task.name={t.name!r} has none: drop task.env_id (or use an embodied preset, "
            f"experiment=cartpole_hybrid task.env_id={t.env_id})"
        )
    if t.name == "jsonl" and t.max_operand != defaults.max_operand:
        yield (
            f"task.max_operand={t.max_operand} sizes the built-in arithmetic task; task.name="
            f"'jsonl' reads its prompts from task.path: drop task.max_operand (or use "
            f"task.name=arithmetic)"
        )


def _unread_by_gym(t: Any, defaults: Any) -> Iterator[str]:
    """Prompt-task keys set on ``task.name=gym``: a simulator policy reads no prompts, so their
    sizes, a reward function, a system prompt, a chat template, their seed, a data generator or
    a text environment would be ignored.
    (``task.params`` is refused for every task that is not ``jsonl``; ``task.max_prompt_length``
    stays: the memory plan sizes sequences from it for every runner.)"""
    if t.name != "gym":
        return
    sized = (
        "sizes a prompt task; task.name='gym' runs an environment (env.num_envs, "
        "env.rollout_steps, env.eval_episodes size it)"
    )
    language = (
        "is for a language task (task.name=jsonl or arithmetic); task.name='gym' scores "
        "episodes by the environment's reward"
    )
    why = dict.fromkeys(("num_train", "num_eval", "max_operand"), sized)
    why |= dict.fromkeys(("reward_fn", "system_prompt", "chat_template"), language)
    why |= {
        "seed": "seeds a prompt task's data; task.name='gym' seeds its environments, sampling "
        "and shuffling from the run's seed (set seed=... to change them)",
        "generate": "writes a language task's data files (task.name=jsonl); task.name='gym' "
        "runs an environment and reads no data",
        "env": "is a text environment for a language model's multi-turn episodes; "
        "task.name='gym' steps the Gymnasium environment task.env_id names",
    }
    for key, reason in why.items():
        value = getattr(t, key)
        if value != getattr(defaults, key):
            yield f"task.{key}={value!r} {reason}: drop task.{key}"


@check
def _trainer(cfg: RunConfig) -> Iterator[str]:
    t = cfg.trainer
    yield from _positive("trainer.total_steps", t.total_steps)
    yield from _positive("trainer.train_batch_size", t.train_batch_size)
    yield from _positive("trainer.eval_every", t.eval_every, zero_ok=True)
    yield from _positive("trainer.save_every", t.save_every, zero_ok=True)
    yield from _positive("trainer.max_restarts", t.max_restarts, zero_ok=True)
    yield from _positive("trainer.max_staleness", t.max_staleness, zero_ok=True)
    if t.partial_rollout not in ("finish", "restart", "continue", "carry"):
        yield (
            f"trainer.partial_rollout={t.partial_rollout!r} is not valid: choose 'finish' (a "
            f"generation running when the actor publishes new weights ends with the old ones, "
            f"counted as stale), 'restart' (it is cancelled and run again with the new ones), "
            f"'continue' (it keeps its tokens and samples the rest with the new ones) or 'carry' "
            f"(unfinished rows are carried into the next generation call)"
        )
    elif t.partial_rollout == "carry":
        yield from carry_problems(cfg)
    else:
        yield from partial_rollout_problems(cfg)
        yield from auto_partial_rollout_problems(cfg)
    for key, value, what in (
        ("carry_segment", t.carry_segment, "sizes the segments"),
        ("carry_surplus", t.carry_surplus, "sets the buffer's surplus"),
    ):
        if value is not None and t.partial_rollout != "carry":
            yield (
                f"trainer.{key}={value} {what} of trainer.partial_rollout=carry; "
                f"trainer.partial_rollout={t.partial_rollout!r} has none: drop trainer.{key} or "
                f"set trainer.partial_rollout=carry"
            )
    yield from sampler_problems(cfg)
    if t.time_budget_s is not None:
        yield from _positive("trainer.time_budget_s", t.time_budget_s)
    if t.target_accuracy is not None and not 0 < t.target_accuracy <= 1:
        yield f"trainer.target_accuracy={t.target_accuracy} must be in (0, 1]"
    owner = checkpoint_dir_owner_problems(t.checkpoint_dir, t.resume)
    yield from owner  # before the write probe: a directory that is not the run's stays untouched
    if not owner:
        yield from checkpoint_dir_problems(t.checkpoint_dir, probe=cfg.mode == "train")
    inputs = {"model.path": cfg.model.path, "reward.model_path": cfg.reward.model_path}
    inputs.update({"task.path": cfg.task.path, "task.eval_path": cfg.task.eval_path})
    yield from inputs_in_checkpoint_dir(t.checkpoint_dir, inputs)
    local = t.resume is not None and "://" not in t.resume
    if t.resume not in (None, "auto") and local and not os.path.exists(t.resume):
        yield (f"trainer.resume={t.resume!r} is neither 'auto' nor an existing checkpoint path")


def modelled_length_problems(cfg: RunConfig) -> Iterator[str]:
    """``simulate.response_length_median`` where it would charge nothing, or would be
    predicted with other lengths."""
    median = cfg.simulate.response_length_median
    if median <= 0:
        return
    key = f"simulate.response_length_median={median:g}"
    if cfg.simulate.rollout_token_latency_ms <= 0:
        yield (
            f"{key} sets the modelled lengths that simulate.rollout_token_latency_ms charges per "
            f"decoding step, which is 0: set simulate.rollout_token_latency_ms > 0 or drop the "
            f"median"
        )
    if cfg.runner != "reasoning":
        yield (
            f"{key} models response lengths of the reasoning rollout; runner={cfg.runner!r} "
            f"decodes none: drop it"
        )
    w = cfg.whatif
    if w.hardware is None and w.response_length != "max":
        yield (
            f"{key} with whatif.response_length={w.response_length!r}: the what-if simulator "
            f"predicts simulated devices with the modelled lengths; drop "
            f"whatif.response_length (or the median)"
        )


def carry_problems(cfg: RunConfig) -> Iterator[str]:
    """``trainer.partial_rollout=carry`` with settings it does not support (docs/async.md#carry):
    each line names the key, the value and the fix."""
    t, fix = cfg.trainer, "or choose trainer.partial_rollout=continue"
    if t.carry_segment is not None and t.carry_segment < 1:
        yield f"trainer.carry_segment={t.carry_segment}: give at least 1 decoding step"
    surplus, auto = t.carry_surplus, cfg.placement.mode == "auto"
    if surplus is not None and not auto and not 1 <= surplus <= max(t.max_staleness - 1, 1):
        yield (
            f"trainer.carry_surplus={surplus} with trainer.max_staleness={t.max_staleness}: a "
            f"group waits about carry_surplus calls before it trains and must train within "
            f"max_staleness versions, so with more than max_staleness - 1 steps held ahead "
            f"every group would be dropped for the bound; give 1..{max(t.max_staleness - 1, 1)} "
            f"(or raise trainer.max_staleness)"
        )
    yield from auto_carry_surplus_problems(cfg)
    if auto:
        yield from auto_carry_problems(cfg)
    elif t.max_staleness < 2:
        yield (
            f"trainer.partial_rollout=carry with trainer.max_staleness={t.max_staleness}: a row "
            f"carried into the next call trains at least 2 versions after the one that started "
            f"it; set trainer.max_staleness>=2 (placement=disaggregated) {fix}"
        )
    segmented = registry.engine_names("generation", having="segments")
    unsupported = (
        ("rollout.backend", cfg.rollout.backend, cfg.rollout.backend not in segmented,
         "only an engine with `segments` decodes carried rows across calls (vLLM would need "
         "abort and resume of its requests, which only a GPU test can cover)",
         "|".join(segmented)),
        ("placement.fuse", cfg.placement.fuse, str(cfg.placement.fuse).lower() == "true",
         "a fused rank trains what its own call generated", "false"),
        ("algorithm.filter_groups", cfg.algorithm.filter_groups, bool(cfg.algorithm.filter_groups),
         "the batch stage would ask one step for more rounds", "false"),
        ("trainer.sampler", t.sampler, t.sampler != "in_order",
         "the pooled samplers train rank shards, carry hands on groups", "in_order"),
        ("rollout.dispatch", cfg.rollout.dispatch, cfg.rollout.dispatch != "in_order",
         "the groups handed on are not the prompts sent", "in_order"),
        ("task.env", cfg.task.env, cfg.task.env is not None,
         "multi-turn episodes are not carried", "null"),
    )  # fmt: skip
    # episodes are not continued across weight swaps either: task.env leaves restart or finish
    env_fix = "or choose trainer.partial_rollout=restart or finish"
    for key, value, hit, why, ok in unsupported:
        if hit:
            alt = env_fix if key == "task.env" else fix
            yield (
                f"trainer.partial_rollout=carry with {key}={value!r}: {why}; set {key}={ok} {alt}"
            )


def auto_carry_problems(cfg: RunConfig) -> Iterator[str]:
    """``trainer.partial_rollout=carry`` under placement=auto: its asynchronous candidates run it
    at ``max_staleness=2`` (the synchronous ones finish), so one of them must be tried."""
    a = cfg.placement.auto
    if 1 not in list(a.staleness):
        yield (
            f"trainer.partial_rollout=carry with placement.auto.staleness={list(a.staleness)}: "
            f"no candidate runs asynchronously, so none would carry rows; add 1 to "
            f"placement.auto.staleness (its carry candidates run at max_staleness=2) or drop "
            f"trainer.partial_rollout"
        )


def partial_rollout_problems(cfg: RunConfig) -> Iterator[str]:
    """``trainer.partial_rollout=restart|continue`` where no generation can be running at a
    weight swap: with ``max_staleness=0`` the next generation starts after the update, so the
    policy would change nothing (unless ``placement=auto`` may pick ``max_staleness=1``)."""
    t = cfg.trainer
    if t.partial_rollout == "finish" or t.max_staleness > 0:
        return
    auto = cfg.placement.auto if cfg.placement.mode == "auto" else None
    if auto is not None and 1 in list(auto.staleness):
        return  # the candidates with max_staleness=1 use it
    yield (
        f"trainer.partial_rollout={t.partial_rollout!r} with trainer.max_staleness=0: the "
        f"synchronous loop starts each generation after the weight swap, so none is running "
        f"at one and the policy changes nothing; set trainer.max_staleness>=1 "
        f"(placement=disaggregated) or drop trainer.partial_rollout (finish)"
    )


def auto_partial_rollout_problems(cfg: RunConfig) -> Iterator[str]:
    """``placement.auto.partial_rollout`` set where it would change nothing (placement=auto
    only): no asynchronous candidate to apply it to, or a list that drops the policy
    ``trainer.partial_rollout`` chose."""
    a = cfg.placement.auto
    policies = a.partial_rollout
    if cfg.placement.mode != "auto" or policies is None:
        return
    kind = _runner_kind(cfg)
    if (kind is not None and kind.steps_env) or 1 not in list(a.staleness):
        yield (
            f"placement.auto.partial_rollout={list(policies)}: no candidate runs asynchronously "
            f"(placement.auto.staleness={list(a.staleness)}, runner={cfg.runner}; only reasoning "
            f"layouts with max_staleness=1 have a generation running at a weight swap); add 1 "
            f"to placement.auto.staleness or drop placement.auto.partial_rollout"
        )
    chosen = cfg.trainer.partial_rollout
    if chosen != "finish" and list(policies) != [chosen]:
        yield (
            f"placement.auto.partial_rollout={list(policies)} with trainer.partial_rollout="
            f"{chosen!r}: the trainer key fixes the policy; drop placement.auto.partial_rollout "
            f"(or set it to [{chosen}]), or drop trainer.partial_rollout to let auto choose"
        )


def auto_carry_surplus_problems(cfg: RunConfig) -> Iterator[str]:
    """``trainer.carry_surplus`` above 1 under placement=auto, whose ``carry`` candidates run
    at ``max_staleness=2`` (``placement.auto.staleness`` holds 0 and 1 only)."""
    surplus = cfg.trainer.carry_surplus
    if cfg.placement.mode == "auto" and surplus is not None and surplus > 1:
        yield (
            f"trainer.carry_surplus={surplus} with placement=auto: its carry candidates run at "
            f"max_staleness=2, which holds a surplus of at most 1; drop trainer.carry_surplus, "
            f"or choose the placement yourself (placement=disaggregated with "
            f"trainer.max_staleness>={surplus + 1})"
        )


def dispatch_problems(cfg: RunConfig) -> Iterator[str]:
    """``rollout.dispatch``: a known value, and only where prompts are dispatched."""
    d = cfg.rollout.dispatch
    if d not in DISPATCHES:
        yield f"rollout.dispatch={d!r} is not valid: choose one of {list(DISPATCHES)}"
    elif d != "in_order" and cfg.runner != "reasoning":
        yield (
            f"rollout.dispatch={d!r} with runner={cfg.runner!r}: only the reasoning runner "
            f"dispatches prompts to the rollout ranks; set rollout.dispatch=in_order"
        )


def sampler_problems(cfg: RunConfig) -> Iterator[str]:
    """``trainer.sampler`` / ``trainer.sampler_window`` where they would change nothing."""
    t = cfg.trainer
    if t.sampler not in SAMPLERS:
        yield f"trainer.sampler={t.sampler!r} is not valid: choose one of {list(SAMPLERS)}"
        return
    if t.sampler_window is not None and t.sampler != "windowed":
        yield (
            f"trainer.sampler_window={t.sampler_window} sizes the window of trainer.sampler="
            f"'windowed'; trainer.sampler={t.sampler!r} has none: drop trainer.sampler_window "
            f"or set trainer.sampler=windowed"
        )
    if t.sampler == "in_order":
        return
    k = t.max_staleness
    if k < 1 or cfg.runner != "reasoning":
        yield (
            f"trainer.sampler={t.sampler!r} with trainer.max_staleness={k} and runner="
            f"{cfg.runner!r}: a sampler chooses among generations that ran ahead, which only "
            f"the reasoning runner's asynchronous rollout has; set trainer.max_staleness>=1 "
            f"(placement=disaggregated) or trainer.sampler=in_order"
        )
    elif t.sampler != "windowed":
        return
    elif t.sampler_window is None or t.sampler_window < 1:
        yield (
            f"trainer.sampler='windowed' needs trainer.sampler_window=W, the versions it "
            f"keeps, 1 <= W <= trainer.max_staleness={k} (got {t.sampler_window})"
        )
    elif t.sampler_window > k:
        yield (
            f"trainer.sampler_window={t.sampler_window} with trainer.max_staleness={k}: a "
            f"window of more than k versions keeps every version the bound allows, which is "
            f"trainer.sampler=fifo; set trainer.sampler_window<={k} or trainer.sampler=fifo"
        )


# Checks kept in their own modules register themselves on import.
import rltrain.config.device_checks  # noqa: E402, F401
import rltrain.config.engine_checks  # noqa: E402, F401
import rltrain.config.numerics  # noqa: E402, F401
import rltrain.config.unread  # noqa: E402, F401
from rltrain.config.numerics import device_placement_keys  # noqa: E402

# The what-if simulator's section keeps its checks in their own module.
from rltrain.config.whatif_checks import whatif_problems  # noqa: E402

check(whatif_problems)
