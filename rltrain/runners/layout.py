"""Everything about a run that can be known before Ray starts, decided in one place.

:func:`preflight` turns a composed config into a checked :class:`RunLayout`: the config checks,
the inputs (the dataset, the tokenizer, the checkpoint to resume), the plan on the configured
cluster, the batch sizes, whether the step is fused. Every problem it finds is reported together,
in one :class:`~rltrain.errors.ConfigError`. ``python -m rltrain`` and ``python -m rltrain
mode=plan`` both call it, so the plan command refuses exactly what training would refuse before
Ray starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rltrain.config.algorithms import needs_critic
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, RltrainError
from rltrain.kinds import registry
from rltrain.kinds.records import RunnerKind, load

#: What every reasoning run places.
REASONING_COMPONENTS = ("actor", "rollout", "reward")


@dataclass(frozen=True)
class RunLayout:
    """A run's layout: everything decided from the config and a plan, once.

    Computed before Ray starts on the configured cluster (:func:`preflight`), and again on the
    plan of the launched job (the devices Ray reports); :func:`check_launched` refuses a job
    whose two layouts disagree. Workers and runners receive it; nothing re-derives it.

    Attributes:
        plan: the placement plan.
        sizes: the batch sizes (:class:`~rltrain.placement.sizes.BatchSizes` for reasoning runs,
            the embodied runner's sizes for embodied runs).
        critic_sizes: the critic's share of a step (PPO), else None.
        fused: whether actor, rollout and reward run as one process per device.
        fuse_blockers: why an ``auto`` run takes turns instead (empty when fused or not asked).
        spec: the environment's spaces (embodied runs), else None.
        resume: the checkpoint the run resumes from (``trainer.resume`` resolved), or None.
        resume_note: one line on what ``trainer.resume`` resolved to and why.
        resume_differences: the training settings that differ from the checkpoint's, one
            line each (printed before the run continues).
        run: the config the layout was made for, every value the plan decides filled in
            (micro-batch sizes left null); None where the caller's config is already that.
        notes: what the run should say before it starts (choices made for the user, work
            that runs somewhere the user may not expect), one line each.
    """

    plan: Any
    sizes: Any
    critic_sizes: Any = None
    fused: bool = False
    fuse_blockers: tuple[str, ...] = ()
    spec: Any = None
    resume: str | None = None
    resume_note: str = ""
    resume_differences: tuple[str, ...] = ()
    run: Any = None
    notes: tuple[str, ...] = ()

    def world_sizes(self) -> dict[str, int]:
        """Processes per component."""
        return {c: self.plan.world_size(c) for c in self.plan.components}

    def signature(self) -> dict[str, Any]:
        """What a launched job must share with the layout checked before Ray started."""
        return {
            "world sizes": self.world_sizes(),
            "batch sizes": self.sizes,
            "critic sizes": self.critic_sizes,
            "fused": self.fused,
        }


def check_launched(expected: RunLayout, launched: RunLayout) -> None:
    """Refuse a launched job whose layout differs from the one checked before Ray started.

    The configured cluster (``cluster.num_nodes``, ``cluster.devices_per_node``) is what the
    early checks plan on; a joined cluster reports its own devices.

    Raises:
        ResourceError: naming every difference and the fix.
    """
    from rltrain.errors import ResourceError

    want, got = expected.signature(), launched.signature()
    diffs = [f"{k}: configured {want[k]}, launched {got[k]}" for k in want if want[k] != got[k]]
    if diffs:
        raise ResourceError(
            "the cluster Ray reports does not match the configured one, so the job would not run "
            "as planned (" + "; ".join(diffs) + "): set cluster.num_nodes and "
            "cluster.devices_per_node to the cluster's real sizes (python -m rltrain mode=plan "
            "shows the configured plan)"
        )


Problems = list  # of str (a ConfigError's problem) or RltrainError (another kind, kept whole)


def _collect(problems: Problems, fn: Callable[[], Any]) -> Any:
    """Run one check; keep its problems instead of stopping at the first."""
    try:
        return fn()
    except ConfigError as exc:
        problems.extend(exc.problems)
    except RltrainError as exc:
        problems.append(exc)
    return None


def _raise(problems: Problems) -> None:
    """Raise the problems found: one error of its own kind, or all together as a ConfigError."""
    if len(problems) == 1 and isinstance(problems[0], RltrainError):
        raise problems[0]
    if problems:
        raise ConfigError([str(p) for p in problems])


def input_problems(run: RunConfig, run_dir: str | None) -> tuple[Problems, Any]:
    """Problems of the run's inputs: its dataset and tokenizer, and the checkpoint it resumes.

    Args:
        run: the checked config.
        run_dir: this run's output directory (where ``trainer.resume=auto`` looks first), or
            None to skip the search of earlier runs.

    Returns:
        ``(problems, resume)`` where ``resume`` is the :class:`~rltrain.runners.checkpoint.Resume`
        decision (None when it could not be made).
    """
    from rltrain import tasks
    from rltrain.runners.checkpoint import resolve_resume

    problems: Problems = []
    check_task = getattr(tasks, "check_task", None)
    if check_task is not None and registry.runner(run).language_model:
        _collect(problems, lambda: problems.extend(check_task(run)))
    resume = _collect(problems, lambda: resolve_resume(run, run_dir))
    problems += checkpoint_weights_problems(run)
    return problems, resume


def checkpoint_weights_problems(run: RunConfig) -> list[str]:
    """Checkpoints training loads without their weights (``mode=plan`` plans from their
    config.json alone, so it accepts them)."""
    import os

    from rltrain.config.files import weights_problems

    if run.mode != "train":
        return []
    found = []
    if run.model.path and not run.task.generate and os.path.isdir(run.model.path):
        found += weights_problems("model.path", run.model.path)
    if (
        run.reward.kind == "model"
        and run.reward.model_path
        and os.path.isdir(run.reward.model_path)
    ):
        found += weights_problems("reward.model_path", run.reward.model_path)
    return found


def plan_problems(run: RunConfig, plan: Any) -> tuple[Problems, dict[str, Any]]:
    """Every check that needs the plan, for the run's runner; all problems together.

    Args:
        run: the checked config.
        plan: its plan (built with or without the fit check).

    Returns:
        ``(problems, parts)`` with the :class:`RunLayout` fields that could be derived.
    """
    problems: Problems = []
    parts: dict[str, Any] = {}
    _collect(problems, plan.check_fit)
    components = set(plan.components)
    kind = registry.runner(run)
    if kind.pre_ray_components is not None:
        return problems, _own_parts(problems, run, plan, kind, components)
    from rltrain.placement.sizes import derive_critic_sizes, derive_sizes
    from rltrain.runners.fusion import decide_fusion

    before = len(problems)
    _collect(problems, lambda: check_components(run, components))
    if len(problems) > before:
        return problems, parts  # sizes and fusion need the components the runner uses
    _collect(problems, lambda: check_staleness(run, plan))
    _collect(problems, lambda: check_engines(run, plan))
    sizes = _collect(
        problems,
        lambda: derive_sizes(run, plan.world_size("actor"), plan.world_size("rollout")),
    )
    parts["sizes"] = sizes
    if sizes is not None and "critic" in components:
        parts["critic_sizes"] = _collect(
            problems,
            lambda: derive_critic_sizes(run, sizes.samples_per_step, plan.world_size("critic")),
        )
    decision = _collect(problems, lambda: decide_fusion(run, plan))
    if decision is not None:
        parts["fused"], parts["fuse_blockers"] = decision[0], tuple(decision[1])
    return problems, parts


def _own_parts(
    problems: Problems, run: RunConfig, plan: Any, kind: RunnerKind, components: set[str]
) -> dict[str, Any]:
    """The layout parts of a runner kind that checks its own components and derives its own
    sizes (its entry's ``pre_ray_components`` and ``pre_ray_sizes``: the embodied runner)."""
    parts: dict[str, Any] = {}
    before = len(problems)
    _collect(problems, lambda: load(kind.pre_ray_components or "")(run, components))
    if len(problems) > before or kind.pre_ray_sizes is None:
        return parts
    derive = load(kind.pre_ray_sizes)
    worlds = (plan.world_size("env"), plan.world_size("rollout"), plan.world_size("actor"))
    parts["sizes"] = _collect(problems, lambda: derive(run, *worlds))
    if kind.steps_env:
        from rltrain.workers.env import probe_spaces

        parts["spec"] = _collect(problems, lambda: probe_spaces(run.task.env_id))
    return parts


def layout_for(run: RunConfig, plan: Any) -> RunLayout:
    """The run's layout on ``plan``, every plan-dependent check made (problems together).

    Raises:
        ConfigError: every problem found (or the one error of another kind).
    """
    problems, parts = plan_problems(run, plan)
    _raise(problems)
    return RunLayout(plan=plan, **parts)


def check_components(run: RunConfig, components: set[str]) -> None:
    """Refuse a reasoning placement that lacks a component the algorithm needs, or holds one it
    does not use (one the runner has no worker for, as ``env``, or one the algorithm leaves
    unstarted).

    The KL (``algorithm.kl_coef > 0``) needs a ``reference`` component, unless the actor trains
    LoRA adapters (``actor.lora.rank > 0``): then the reference is the actor's own model with
    its adapters disabled, and a placed reference is optional (used when placed).

    Raises:
        ConfigError: naming the missing or extra components and the fix.
    """
    _refuse_workerless(run, components)
    need = list(REASONING_COMPONENTS)
    if run.algorithm.kl_coef > 0 and not own_reference(run, components):
        need.append("reference")
    missing = [c for c in need if c not in components]
    if missing:
        raise ConfigError(
            f"placement.component_placement places no {missing} but runner=reasoning with "
            f"algorithm.kl_coef={run.algorithm.kl_coef} needs {need}: add them to the placement"
            + (" (the reference computes the KL's log-probs)" if "reference" in missing else "")
        )
    estimator = run.algorithm.advantage_estimator
    critic = needs_critic(estimator)
    if critic and "critic" not in components:
        raise ConfigError(
            f"placement.component_placement places {sorted(components)} but "
            f"algorithm.advantage_estimator={estimator!r} needs a critic: use experiment="
            f"reasoning_ppo (or reasoning_ppo_hybrid / reasoning_ppo_disaggregated), or add "
            f"+placement.component_placement.critic=all"
        )
    if "critic" in components and not critic:
        raise ConfigError(
            f"placement.component_placement places a critic but algorithm.advantage_estimator="
            f"{estimator!r} does not use one: remove it from the placement, or use "
            f"algorithm=ppo (gae)"
        )
    if "reference" in components and run.algorithm.kl_coef <= 0:
        raise ConfigError(
            f"placement.component_placement places a reference but algorithm.kl_coef="
            f"{run.algorithm.kl_coef}: the reference only computes the KL's log-probs, so the "
            f"run would never start it; remove it from the placement, or set "
            f"algorithm.kl_coef > 0"
        )
    for path in registry.training_engine(run).pre_ray_checks:
        load(path)(run, None)  # the engine's own limits (DeepSpeed's)


def _refuse_workerless(run: RunConfig, components: set[str]) -> None:
    """Refuse placed components the runner has no worker for (``env`` in a reasoning run): the
    plan would hold their processes and the run start none."""
    unused = sorted(
        c
        for c in components
        if c in registry.component_names() and registry.component(c).workers.get(run.runner) is None
    )
    if unused:
        what = "; ".join(f"{c}: {registry.component(c).summary}" for c in unused)
        raise ConfigError(
            f"placement.component_placement places {unused}, which runner={run.runner} does not "
            f"use ({what}): remove "
            + " and ".join(f"placement.component_placement.{c}" for c in unused)
        )


def own_reference(run: RunConfig, components: set[str]) -> bool:
    """Whether the actor computes the KL's reference log-probs itself (LoRA: its adapters
    disabled) because no ``reference`` component is placed.

    Raises:
        ConfigError: a PPO critic with ``algorithm.kl_in='reward'`` also needs them (its returns
            take the KL) and only a placed reference hands them to it.
    """
    if run.actor.lora.rank <= 0 or run.algorithm.kl_coef <= 0 or "reference" in components:
        return False
    if run.algorithm.kl_in == "reward" and "critic" in components:
        raise ConfigError(
            f"actor.lora.rank={run.actor.lora.rank} without a placed reference: the actor "
            f"computes the reference log-probs itself, but algorithm.kl_in='reward' with a "
            f"critic needs them in the critic's returns too: place a reference "
            f"(+placement.component_placement.reference=all) or use algorithm.kl_in=loss"
        )
    return True


def check_staleness(run: RunConfig, plan: Any) -> None:
    """Refuse asynchronous rollout where rollout and actor share a device.

    On a shared device the two take turns (residency leases), so there is nothing to overlap
    and the rollout would sample with stale weights for no gain.

    Raises:
        ConfigError: ``trainer.max_staleness > 0`` with a device holding both.
    """
    k = run.trainer.max_staleness
    if k <= 0:
        return
    shared = sorted(d for d, comps in plan.sharing.items() if {"actor", "rollout"} <= set(comps))
    if shared:
        mode = getattr(plan.mode, "value", plan.mode)
        raise ConfigError(
            f"trainer.max_staleness={k} needs rollout and actor on separate devices, but "
            f"placement (mode {mode}) puts both on (node, device) {shared}: use "
            f"placement=disaggregated (or give placement.component_placement.actor and .rollout "
            f"disjoint devices), or set trainer.max_staleness=0; a {mode} layout stays "
            f"synchronous"
        )


def check_engines(run: RunConfig, plan: Any) -> None:
    """Refuse, before Ray starts, engine settings this plan cannot serve.

    - a reward model placed on more than one process (one process scores the step);
    - ``rollout.gpu_memory_utilization`` against the plan's devices (vLLM); ZeRO-3 on several
      actor ranks (DeepSpeed);
    - an explicit ``weight_sync.transport`` the layout cannot serve, when the plan's devices
      are what the run will get (a joined cluster's devices, and a local GPU machine's, are
      found when Ray starts, and the choice is checked then).

    Raises:
        ConfigError: naming the key, the value and the fix.
    """
    if run.reward.kind == "model" and plan.world_size("reward") > 1:
        raise ConfigError(
            f"reward.kind='model' is placed on {plan.world_size('reward')} processes, but one "
            f"process scores a step: place the reward on one device or node "
            f"(placement.component_placement.reward=0)"
        )
    for path in registry.generation_engine(run).pre_ray_checks:
        load(path)(run, plan)  # e.g. vLLM's memory reservation on the plan's devices
    for path in registry.training_engine(run).pre_ray_checks:
        load(path)(run, plan)  # e.g. DeepSpeed's ZeRO-3 on the plan's actor ranks
    from rltrain.config.engine_checks import local_gpus_visible
    from rltrain.placement.transport_choice import choose_transport

    simulated = any(n.accelerator_type == "sim" for n in plan.cluster.nodes)
    # Simulated devices in the config-made plan are what the run gets only on a local Ray of a
    # machine without GPUs; a joined cluster, or local GPUs, is discovered when Ray starts.
    if not simulated or (run.cluster.address is None and not local_gpus_visible()):
        for recv in registry.weight_receivers():
            choose_transport(run, plan, recv)


def preflight(run: RunConfig, run_dir: str | None = None, plan: Any = None) -> RunLayout:
    """Check everything that can be checked before Ray starts, and lay the run out.

    Args:
        run: the config, already through :func:`~rltrain.config.load_config`.
        run_dir: the run's output directory (``trainer.resume=auto`` looks for earlier runs of
            the same experiment beside it); None skips that search.
        plan: a plan already built from ``run`` (the plan command builds it without the fit
            check, to draw it first); None builds it on the configured cluster.

    Returns:
        The layout.

    Raises:
        ConfigError: every problem found, each naming the key, the value and the fix.
        PlacementError: the placement itself cannot be resolved (nothing plan-dependent could
            be checked then; the input problems are reported with it).
    """
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec

    run, chosen = decide_for_user(run)
    problems, resume = input_problems(run, run_dir)
    if plan is None:
        plan = _collect(
            problems, lambda: build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
        )
        if plan is None:
            _raise(problems)
    more, parts = plan_problems(run, plan)
    _raise(problems + more)
    return RunLayout(
        plan=plan,
        resume=resume.path if resume is not None else None,
        resume_note=resume.note if resume is not None else "",
        resume_differences=resume.differences if resume is not None else (),
        run=run,
        notes=tuple(chosen) + run_notes(run, plan) + fusion_notes(run, parts.get("fuse_blockers")),
        **parts,
    )


def fusion_notes(run: RunConfig, blockers: tuple[str, ...] | None) -> tuple[str, ...]:
    """A line a run says at start when ``placement.fuse=auto`` falls back to separate
    processes, with what stands in the way (``mode=plan`` says it in its ``processes:`` line).

    Args:
        run: the checked run config.
        blockers: the layout's ``fuse_blockers`` (None or empty: nothing to say).

    Returns:
        The line, or nothing.
    """
    if not blockers:
        return ()
    return (
        f"processes: not fused (placement.fuse={str(run.placement.fuse).lower()}), actor, "
        f"rollout and reward run in processes of their own: " + "; ".join(blockers),
    )


def decide_for_user(run: RunConfig) -> tuple[RunConfig, list[str]]:
    """Fill in what the config leaves to rltrain: micro-batch sizes left null, the largest
    whose plan fits (:mod:`rltrain.placement.micro_batches`) on the cluster the run plans on
    (``mode=plan`` with ``whatif.hardware``: that accelerator's devices, as the plan itself).

    Returns:
        ``(run, notes)``: the run with every such value set (the same object when none was
        left), and a line saying what was chosen (none when nothing was).
    """
    from rltrain.placement.micro_batches import choose_micro_batches

    cluster = None
    if run.mode == "plan" and run.whatif.hardware is not None:
        from rltrain.whatif.predict import planned_cluster

        cluster = planned_cluster(run)
    run, choice = choose_micro_batches(run, cluster)
    line = choice.describe()
    return run, [line] if line else []


def run_notes(run: RunConfig, plan: Any) -> tuple[str, ...]:
    """What a run should say before it starts about where its work runs.

    A reward model placed on no device (the shipped placements put the rule reward on node 0's
    CPU) runs on CPU: said, with the fix, since a model there is much slower than on a device.
    """
    notes = []
    if run.reward.kind == "model" and "reward" in plan.components:
        if not any(p.devices for p in plan.by_component["reward"]):
            notes.append(
                f"reward.kind=model: the reward model ({run.reward.model_path}) runs on the "
                f"CPU of its node, because placement.component_placement.reward places it on "
                f"no device; give it one to run it there (e.g. "
                f"placement.component_placement.reward=0)"
            )
    return tuple(notes)
