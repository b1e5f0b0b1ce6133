"""What a composed job needs from the cluster, from its placement plan.

The one place the launcher asks rltrain about a job (:func:`job_needs`): the checks a single run
makes before Ray starts, and the devices its plan uses.
Jobs of other Hydra apps (configs not typed by rltrain's run schema) need no devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, read_write

from hydra_plugins.rltrain_launcher._slices import Device

#: The keys that choose a sweep job's run directory, as refusals name them.
JOB_DIR_KEY = "hydra.sweep.dir (with hydra.sweep.subdir)"


@dataclass(frozen=True)
class JobNeeds:
    """A job's demands on the sweep's cluster.

    Attributes:
        devices: ``(node_rank, local_device)`` pairs the job's plan uses.
        placement_mode: the plan's mode (``collocated`` ...), None for non-rltrain jobs.
        uses_ray: whether the job's driver connects to the sweep's Ray cluster.
        cluster: the job's ``cluster`` section (plain, resolved), None for non-rltrain jobs.
        error: why the job can never run (a ConfigError/PlacementError/ResourceError), or None.
    """

    devices: frozenset[Device] = frozenset()
    placement_mode: str | None = None
    uses_ray: bool = False
    cluster: Mapping[str, Any] | None = None
    error: Exception | None = None


def is_rltrain_config(cfg: DictConfig) -> bool:
    """Whether a composed task config (without ``hydra``) describes an rltrain run.

    A config composed by Hydra is one when it is typed by rltrain's run schema (rltrain's
    primary config starts from ``rltrain_schema``). A plain one (a test's, built from a
    resolved container) is one when it holds every section of that schema: another app's
    config that merely has ``cluster``, ``placement`` or ``trainer`` keys of its own is not.

    Args:
        cfg: the job's composed config.

    Returns:
        Whether to check and plan the job as an rltrain run.
    """
    import dataclasses

    from rltrain.config.schema import RunConfig

    typed = OmegaConf.get_type(cfg)
    if typed is not None and typed is not dict:
        return typed is RunConfig
    return all(f.name in cfg for f in dataclasses.fields(RunConfig))


def plan_mode(run: Any) -> str | None:
    """The placement mode of a job that only plans (``mode=plan``), found without writing
    anything: the plan on the job's configured cluster, sized as the plan command sizes it.

    Raises:
        PlacementError, ConfigError: the placement cannot be laid out.
    """
    import dataclasses

    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec
    from rltrain.tasks import planning_model

    planned = dataclasses.replace(run, model=planning_model(run))
    plan = build_plan(planned, ClusterSpec.from_config(run.cluster), check_fit=False)
    return str(getattr(plan.mode, "value", plan.mode) or "") or None


def checked_layout(run: Any, output_dir: str | None) -> Any:
    """Every check a single run makes before Ray starts, for one training job.

    ``task.generate``'s data is written first (as a single run does), then
    :func:`rltrain.runners.layout.preflight` checks the inputs, the plan on the configured
    cluster and every plan-dependent rule (sizes, components, engines, fit).

    Args:
        run: the job's checked :class:`rltrain.config.RunConfig`.
        output_dir: the job's run directory (``trainer.resume=auto`` looks beside it).

    Returns:
        The job's :class:`~rltrain.runners.layout.RunLayout`.

    Raises:
        ConfigError, PlacementError, ResourceError: what the single run would refuse.
    """
    from rltrain.runners.layout import preflight

    _look_at_task_files(run)  # the plan reads the checkpoint the generator writes
    return preflight(run, output_dir)


def job_needs(
    task_cfg: DictConfig,
    output_dir: str | None = None,
    *,
    config_loader: Any = None,
    config_name: str | None = None,
    overrides: Sequence[str] = (),
) -> JobNeeds:
    """Check and plan one job, as a single run would before Ray starts.

    Once its config checks, the job's run directory is claimed, as a single run's is before Hydra
    writes into it (:func:`rltrain.app.claim_run_dir`): a user's directory, or an earlier run's
    holding checkpoints a fresh run would delete, refuses the job before its driver writes
    ``.hydra/`` there.
    A job whose overrides choose a config group its preset (``experiment=...``) also writes
    is refused first, as a single run is (:mod:`rltrain.config.presets`). Its overrides'
    ``key={}`` empty their mappings first, as its driver's do (``placement.offload={}`` drops
    the shipped policies: :mod:`rltrain.config.overrides`). A job that only
    plans (``mode=plan``) needs no devices and no Ray: it is checked when it runs, as its plan
    command writes its plan first. Any other job goes through every check of a single run
    (:func:`checked_layout`), so a job that would be refused fails at once, with the same
    message.

    Args:
        task_cfg: the job's composed, resolved config without the ``hydra`` node (its
            emptied mappings are emptied in place).
        output_dir: the job's run directory.
        config_loader: the sweep's Hydra config loader; None skips the preset check.
        config_name: the sweep's primary config name.
        overrides: the job's overrides.

    Returns:
        The job's needs; ``error`` is set (and nothing else trusted) when the job can never run.
    """
    if not is_rltrain_config(task_cfg):
        return JobNeeds()
    from rltrain.app import claim_run_dir
    from rltrain.config import load_config
    from rltrain.config.overrides import apply_empty_mappings
    from rltrain.config.presets import check_group_choices
    from rltrain.errors import RltrainError

    with read_write(task_cfg):  # as its driver does before it checks anything (rltrain.app)
        apply_empty_mappings(task_cfg, overrides)
    cluster = dict(OmegaConf.to_container(task_cfg.cluster, resolve=True))  # type: ignore[arg-type]
    try:
        if config_loader is not None:
            check_group_choices(config_loader, config_name, overrides)
        run = load_config(task_cfg)
        if output_dir is not None:  # before the job's driver writes .hydra/ there
            claim_run_dir(output_dir, run, key=JOB_DIR_KEY)
        if run.mode == "plan":
            return _plan_only_needs(run, cluster)
        if run.placement.mode == "auto":
            return _auto_needs(run, cluster)
        layout = checked_layout(run, output_dir)
    except RltrainError as exc:
        return JobNeeds(cluster=cluster, error=exc)
    plan = layout.plan
    mode = str(getattr(plan.mode, "value", plan.mode) or "") or None
    return JobNeeds(
        devices=frozenset(plan.devices_used()), placement_mode=mode, uses_ray=True, cluster=cluster
    )


def _plan_only_needs(run: Any, cluster: dict[str, Any]) -> JobNeeds:
    """A ``mode=plan`` job: no devices; refused now if its task files or layout never could be."""
    _look_at_task_files(run)  # only looks (a plan writes nothing): refuses a user's files
    mode = plan_mode(run)  # the layout can be built (auto: the first one profiled)
    auto = run.placement.mode == "auto"
    return JobNeeds(placement_mode="auto" if auto else mode, cluster=cluster)


def _look_at_task_files(run: Any) -> None:
    """``task.generate``'s check of the files it would write (a language-model run's), which
    refuses a user's own files before the job is admitted."""
    from rltrain.kinds import registry

    if run.task.generate and registry.runner(run).language_model:
        from rltrain.tasks import prepare_task

        prepare_task(run)


def _auto_needs(run: Any, cluster: dict[str, Any]) -> JobNeeds:
    """A ``placement=auto`` training job: checked as a single auto run is before it profiles
    (the config, then ``task.generate``'s data), reserving every device of its cluster, over
    which it profiles and chooses. Its layouts are checked when it chooses, as a single run's
    are (the config's own layout is only the first one profiled)."""
    from rltrain.placement.types import ClusterSpec

    _look_at_task_files(run)
    spec = ClusterSpec.from_config(run.cluster)
    devices = frozenset((n.rank, d) for n in spec.nodes for d in range(n.num_devices))
    return JobNeeds(devices=devices, placement_mode="auto", uses_ray=True, cluster=cluster)
