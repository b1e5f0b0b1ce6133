"""The rltrain Hydra launcher: ``hydra/launcher=rltrain``.

Import-light on purpose (Hydra imports this module whenever it scans for plugins): only the
config schema and the launcher class live here; Ray and the sweep machinery are imported by
:mod:`hydra_plugins.rltrain_launcher._core` when a sweep actually launches.

The config keeps hydra-ray-launcher's public shape (``ray.init`` for ``ray.init(...)`` keyword
arguments, ``ray.remote`` for per-job Ray options), so a user can switch between
``hydra/launcher=ray`` and ``hydra/launcher=rltrain`` without rewriting it.

No ``from __future__ import annotations`` here: Hydra's plugin scan executes this module without
registering it in ``sys.modules``, where ``dataclasses`` looks up string annotations.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Dict, Optional  # noqa: UP035 - OmegaConf reads typing.Dict

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class RayConf:
    """Ray options, in hydra-ray-launcher's shape.

    ``init``: keyword arguments of ``ray.init``. ``address`` null means: use the jobs'
    ``cluster.address``; when that is null too, start a private local Ray (loopback, its own temp
    dir) for the whole sweep. The launcher never calls ``ray.init()`` without an address, so it
    never joins a stray Ray instance on the machine by accident.

    ``remote``: options for each job's Ray driver. Only ``runtime_env`` applies: merged with the
    jobs' ``cluster.runtime_env`` (``env_vars`` variable by variable; one key set to two values
    is refused), it becomes the job's runtime environment, inherited by every actor the job
    starts. A job's driver reserves no resources itself: its devices come from its plan.
    """

    init: Dict[str, Any] = field(default_factory=lambda: {"address": None})  # noqa: UP006
    remote: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006


@dataclass
class RltrainLauncherConf:
    """Schema of ``hydra/launcher=rltrain``."""

    _target_: str = "hydra_plugins.rltrain_launcher.rltrain_launcher.RltrainLauncher"
    ray: RayConf = field(default_factory=RayConf)
    # Jobs running at once. Above 1, jobs whose plans fit on disjoint devices run side by side.
    max_concurrent_jobs: int = 1
    # Kill a job's driver after this many seconds (> 0; null: no limit); the job then fails.
    job_timeout_s: Optional[float] = None
    # Seconds (> 0) to wait for Ray to free a finished job's devices before admitting the next.
    release_timeout_s: float = 60.0
    # Write sweep_report.{csv,md} (and a throughput chart) into the sweep directory.
    report: bool = True


ConfigStore.instance().store(
    group="hydra/launcher", name="rltrain", node=RltrainLauncherConf, provider="rltrain"
)


class RltrainLauncher(Launcher):
    """Runs a Hydra sweep on one Ray cluster, placing each job's devices from its plan."""

    def __init__(
        self,
        ray: DictConfig,
        max_concurrent_jobs: int = 1,
        job_timeout_s: float | None = None,
        release_timeout_s: float = 60.0,
        report: bool = True,
        **unknown: Any,
    ) -> None:
        self.ray_cfg = ray
        # Keys added with `+hydra.launcher.<key>=...`: refused by name when the sweep launches
        # (Hydra's own error for an unexpected argument names neither the key nor the fix).
        self.unknown = unknown
        self.max_concurrent_jobs = max_concurrent_jobs
        self.job_timeout_s = job_timeout_s
        self.release_timeout_s = release_timeout_s
        self.report = report
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        # Report rows of every batch so far: sweepers such as Optuna call launch() repeatedly.
        self.report_rows: list[dict[str, Any]] = []
        # Output directory -> job number, of every batch so far: no two jobs may share one.
        self.job_dirs: dict[str, int] = {}

    def setup(
        self,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        """Keep what :meth:`launch` needs (called once by Hydra before the first batch)."""
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        """Run one batch of jobs; see :func:`hydra_plugins.rltrain_launcher._core.launch`.

        Args:
            job_overrides: the overrides of each job of the batch.
            initial_job_idx: the number of the batch's first job in the whole sweep.

        Returns:
            One ``JobReturn`` per job, in the order given.
        """
        from hydra_plugins.rltrain_launcher import _core

        return _core.launch(self, job_overrides, initial_job_idx)
