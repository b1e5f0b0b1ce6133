"""``placement.auto.*``: what the automatic placement search may do, read and checked once.

The keys live in the run config's ``placement.auto`` section. They are read with defaults here,
so a config composed without that section (an older schema, a test's own config) still works;
:func:`check_auto` names every bad value before anything starts. No Ray, no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rltrain.config.validate import AUTO_FAMILIES
from rltrain.errors import ConfigError
from rltrain.whatif.candidates import DEFAULT_PARTIAL_ROLLOUTS, partial_rollout_policies
from rltrain.whatif.profiles import DEFAULT_CACHE_DIR  # where profiles are cached by default

#: Layout families the search knows (the config's vocabulary).
FAMILIES = AUTO_FAMILIES
#: Pipeline stage counts tried for embodied runs when ``placement.auto.pipeline_stages`` is empty.
DEFAULT_STAGES = (1, 2, 4, 8)


@dataclass(frozen=True)
class AutoSettings:
    """The search's settings (``placement.auto.*``).

    Attributes:
        profile_steps: training steps per profiling run; the first is warm-up and not timed,
            nor is the last unless it is the only one left.
        time_limit_s: wall-clock seconds from the start of profiling after which no profiling
            run starts (skipped; the fit uses the runs made); a run that starts stops training
            at what is left (``trainer.time_budget_s``), its start-up and shutdown unbounded.
        cache_dir: where profiles are cached (``~`` expanded).
        reprofile: ignore a cached profile and measure again.
        candidates: the layout families enumerated.
        staleness: ``trainer.max_staleness`` values tried where actor and rollout are apart.
        partial_rollout: ``trainer.partial_rollout`` policies tried by the asynchronous ones
            (``placement.auto.partial_rollout`` resolved against ``trainer.partial_rollout``:
            :func:`rltrain.whatif.candidates.partial_rollout_policies`).
        pipeline_stages: ``env.pipeline_stage_num`` values tried by embodied runs (empty: the
            defaults that divide ``env.num_envs``).
        max_checked: candidates checked with the plan and preflight, fastest predicted first.
        profile_passes: times each profiling layout runs (later passes in reverse order); each
            keeps its fastest reading (``placement.auto.profile_passes``).
    """

    profile_steps: int = 5
    time_limit_s: float = 300.0
    cache_dir: str = DEFAULT_CACHE_DIR
    reprofile: bool = False
    candidates: tuple[str, ...] = FAMILIES
    staleness: tuple[int, ...] = (0, 1)
    partial_rollout: tuple[str, ...] = DEFAULT_PARTIAL_ROLLOUTS
    pipeline_stages: tuple[int, ...] = ()
    max_checked: int = 32
    profile_passes: int = 1

    @property
    def cache_path(self) -> str:
        """The cache directory with ``~`` and variables expanded."""
        return os.path.expandvars(os.path.expanduser(self.cache_dir))

    @classmethod
    def from_run(cls, run: Any) -> AutoSettings:
        """The settings of ``run.placement.auto`` (defaults for missing keys).

        Args:
            run: the run config.

        Returns:
            The settings.

        Raises:
            ConfigError: every bad value (see :func:`check_auto`).
        """
        problems = check_auto(run)
        if problems:
            raise ConfigError(problems)
        fixed = str(getattr(getattr(run, "trainer", None), "partial_rollout", "finish"))
        return cls._read(getattr(getattr(run, "placement", None), "auto", None), fixed)

    @classmethod
    def _read(cls, section: Any, fixed: str = "finish") -> AutoSettings:
        d = cls()

        def get(name: str, default: Any) -> Any:
            value = getattr(section, name, None) if section is not None else None
            if value is None and isinstance(section, dict):
                value = section.get(name)
            return default if value is None else value

        return cls(
            profile_steps=int(get("profile_steps", d.profile_steps)),
            time_limit_s=float(get("time_limit_s", d.time_limit_s)),
            cache_dir=str(get("cache_dir", d.cache_dir)),
            reprofile=bool(get("reprofile", d.reprofile)),
            candidates=tuple(str(x) for x in get("candidates", d.candidates)),
            staleness=tuple(int(x) for x in get("staleness", d.staleness)),
            partial_rollout=partial_rollout_policies(get("partial_rollout", None), fixed),
            pipeline_stages=tuple(int(x) for x in get("pipeline_stages", d.pipeline_stages)),
            max_checked=int(get("max_checked", d.max_checked)),
            profile_passes=int(get("profile_passes", d.profile_passes)),
        )


def check_auto(run: Any) -> list[str]:
    """Every problem of ``placement.auto.*``, each naming the key, the value and the fix (the
    config's own check, :func:`rltrain.config.validate.auto_problems`).

    Args:
        run: the run config (its ``placement.auto`` section may be absent).

    Returns:
        The problems; empty when the settings are usable.
    """
    from rltrain.config.validate import auto_problems

    return list(auto_problems(getattr(getattr(run, "placement", None), "auto", None)))
