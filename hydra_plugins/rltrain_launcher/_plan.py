"""What a composed job needs from the cluster, from its placement plan.

The one place the launcher asks rltrain's placement engine about a job (:func:`plan_devices`).
Jobs of other Hydra apps (no ``cluster`` / ``placement`` sections) need no devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hydra_plugins.rltrain_launcher._slices import Device

#: Sections that make a composed config an rltrain run.
_RLTRAIN_SECTIONS = ("cluster", "placement", "trainer")


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
    """Whether a composed task config (without ``hydra``) describes an rltrain run."""
    return all(key in cfg for key in _RLTRAIN_SECTIONS)


def plan_devices(run: Any) -> tuple[frozenset[Device], str | None]:
    """The devices a checked run config's plan uses, and the plan's mode.

    The plan is resolved against the cluster the job's config describes (what ``mode=plan``
    shows); ``build_plan`` also refuses a plan that does not fit in device memory.

    Args:
        run: a :class:`rltrain.config.RunConfig`.

    Returns:
        ``(devices, mode)``.

    Raises:
        PlacementError, ResourceError, ConfigError: when the plan is impossible.
    """
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec

    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    mode = getattr(plan.mode, "value", plan.mode)
    return frozenset(plan.devices_used()), str(mode) if mode else None


def job_needs(task_cfg: DictConfig) -> JobNeeds:
    """Check and plan one job.

    Args:
        task_cfg: the job's composed, resolved config without the ``hydra`` node.

    Returns:
        The job's needs; ``error`` is set (and nothing else trusted) when the job can never run.
    """
    if not is_rltrain_config(task_cfg):
        return JobNeeds()
    from rltrain.config import load_config
    from rltrain.errors import RltrainError

    cluster = dict(OmegaConf.to_container(task_cfg.cluster, resolve=True))  # type: ignore[arg-type]
    try:
        run = load_config(task_cfg)
        if run.runner == "reasoning" and run.task.generate:
            from rltrain.tasks import prepare_task

            prepare_task(run)  # the plan reads the checkpoint the generator writes
        if run.mode == "plan":
            # `mode=plan` prints the plan and exits without starting Ray.
            _, mode = plan_devices(run)
            return JobNeeds(placement_mode=mode, cluster=cluster)
        devices, mode = plan_devices(run)
    except RltrainError as exc:
        return JobNeeds(cluster=cluster, error=exc)
    return JobNeeds(devices=devices, placement_mode=mode, uses_ray=True, cluster=cluster)
