"""Profiling: short real runs of a few layouts, read back and fitted, cached.

The runs go through the runners' own entry points (:func:`rltrain.runners.reasoning.
run_reasoning`, :func:`rltrain.runners.embodied.run_embodied`) on the configured cluster: real
workers on the real (or simulated) devices. Each is bounded by ``placement.auto.profile_steps``
steps and what is left of ``placement.auto.time_limit_s`` (``trainer.time_budget_s``); a run
that would start after the limit is skipped and the fit uses the runs made. All runs share one
Ray: a local one is started once (and stopped after), an existing one is joined.

Profiles are cached under ``placement.auto.cache_dir`` by :func:`profile_key`: the model, the
task, the cluster, and every setting that changes how long a stage takes (batch sizes, lengths,
engines, latency knobs); not the placement, which is what the profile serves to choose.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.autoplace.candidates import Candidate, apply
from rltrain.autoplace.cost import EmbodiedCosts, ReasoningCosts, costs_from_dict, costs_to_dict
from rltrain.autoplace.fit import fit_embodied, fit_reasoning, profile_candidates
from rltrain.autoplace.readings import RunReading, read_run
from rltrain.autoplace.settings import AutoSettings
from rltrain.errors import ConfigError, ResourceError
from rltrain.kinds import registry
from rltrain.kinds.records import load
from rltrain.whatif.profiles import PROFILE_VERSION, TIMING_SECTIONS, profile_key  # noqa: F401

log = logging.getLogger("rltrain")

#: Steps left out of each profiling run's timing (first calls, first allocations).
WARMUP_STEPS = 1


@dataclass(frozen=True)
class Profile:
    """A run's measured costs.

    Attributes:
        key: the cache key (:func:`profile_key`).
        runner: ``reasoning`` or ``embodied``.
        costs: the fitted cost terms.
        runs: each profiling run: its layout name, devices, stage count and reading.
        source: ``measured`` (this call profiled) or ``cache`` (read from ``path``).
        seconds: wall-clock seconds the profiling took when it was measured.
        created: when it was measured (ISO date and time).
        path: the cache file.
        skipped: profiling layouts not run because the time limit was reached.
    """

    key: str
    runner: str
    costs: ReasoningCosts | EmbodiedCosts
    runs: tuple[Mapping[str, Any], ...]
    source: str = "measured"
    seconds: float = 0.0
    created: str = ""
    path: str = ""
    skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION,
            "key": self.key,
            "runner": self.runner,
            "costs": costs_to_dict(self.costs),
            "runs": [dict(r) for r in self.runs],
            "seconds": self.seconds,
            "created": self.created,
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "") -> Profile:
        return cls(
            key=str(d["key"]),
            runner=str(d["runner"]),
            costs=costs_from_dict(d["costs"]),
            runs=tuple(d.get("runs", ())),
            source="cache",
            seconds=float(d.get("seconds", 0.0)),
            created=str(d.get("created", "")),
            path=path,
            skipped=tuple(d.get("skipped", ())),
        )


# -------------------------------------------------------------------------------- the cache
def cache_file(settings: AutoSettings, key: str) -> str:
    return os.path.join(settings.cache_path, f"{key}.json")


def load_cached(settings: AutoSettings, key: str) -> Profile | None:
    """The cached profile of ``key``, or None (absent, unreadable or of another version)."""
    path = cache_file(settings, key)
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("version") != PROFILE_VERSION or data.get("key") != key:
            return None
        return Profile.from_dict(data, path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_cached(settings: AutoSettings, profile: Profile) -> str:
    """Write a profile into the cache (atomically: side-by-side jobs may share the cache).

    Returns:
        The file written.
    """
    path = cache_file(settings, profile.key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(profile.to_dict(), f, indent=1)
    os.replace(tmp, path)
    return path


# -------------------------------------------------------------------------------- the runs
def profile_run_config(run: Any, cand: Candidate, steps: int, budget_s: float, out_dir: str) -> Any:
    """The config of one profiling run: the candidate's layout, ``steps`` steps, stopping after
    ``budget_s`` seconds of training, timeline on, trackers and progress off, no target, no
    resume, checkpoints inside ``out_dir``. A fused layout is asked for with
    ``placement.fuse=auto``: a run that cannot fuse takes turns (its reading says which)."""
    r = apply(run, cand)
    if cand.fused:
        r = dataclasses.replace(r, placement=dataclasses.replace(r.placement, fuse="auto"))
    trainer = dataclasses.replace(
        r.trainer,
        total_steps=steps,
        eval_every=0,
        save_every=0,
        target_accuracy=None,
        resume=None,
        max_restarts=0,
        checkpoint_dir=os.path.join(out_dir, "checkpoints"),
        time_budget_s=max(budget_s, 1.0),
    )
    logging_cfg = dataclasses.replace(
        r.logging,
        jsonl=True,
        trace=True,
        progress=False,
        tensorboard=False,
        wandb=False,
        mlflow=False,
    )
    changes: dict[str, Any] = {"trainer": trainer, "logging": logging_cfg, "mode": "train"}
    if registry.runner(r).steps_env:  # the final greedy evaluation is not what is measured
        changes["env"] = dataclasses.replace(r.env, target_return=None, eval_episodes=1)
    return dataclasses.replace(r, **changes)


def _entry(runner: str) -> Callable[[Any, str], dict]:
    """The function driving a run of the runner kind (its entry's ``entry``)."""
    return load(registry.runner(runner).entry)


def node_devices(run: Any) -> int:
    """Devices of node 0 as the config describes the cluster."""
    per = run.cluster.devices_per_node
    if isinstance(per, int):
        return per
    return int(list(per)[0])


def measure(
    run: Any,
    settings: AutoSettings,
    out_dir: str,
    clock: Callable[[], float] = time.monotonic,
    entry: Callable[[Any, str], dict] | None = None,
) -> Profile:
    """Profile a run: make the profiling runs, read them, fit the costs.

    Args:
        run: the base run config.
        settings: ``placement.auto.*``.
        out_dir: where the profiling runs write (one directory per run).
        clock: the clock the time limit is kept with.
        entry: the runner's entry point (default: the run's runner).

    Returns:
        The measured profile (not yet cached).

    Raises:
        ConfigError: no profiling layout passes the checks.
        ResourceError: no profiling run recorded a timed step within the limit.
        ConfigError / PlacementError / WorkerError: a profiling run failed (its message).
    """
    from rltrain.scheduler import Cluster

    entry = entry or _entry(run.runner)
    slots = profile_candidates(
        run.runner, node_devices(run), run.env.pipeline_stage_num, run.env.num_envs
    )
    start = clock()
    skipped: list[str] = []
    specs = [c for c in (_first_valid(run, slot) for slot in slots) if c is not None]
    if not specs:
        raise ConfigError(
            "placement=auto: no layout to profile passes the checks training makes (every "
            "layout of node 0's devices is refused): lower the memory the run needs or give "
            "the cluster more devices; python -m rltrain mode=plan placement=collocated shows "
            "why"
        )
    # Later passes run the layouts in reverse order; each layout keeps its fastest reading, so
    # load that comes and goes on a shared machine does not decide the profile.
    order = [specs if i % 2 == 0 else specs[::-1] for i in range(max(settings.profile_passes, 1))]
    best: dict[str, tuple[Candidate, RunReading]] = {}
    cluster = Cluster.start(run.cluster)  # one Ray for every profiling run
    try:
        for i, batch in enumerate(order):
            for cand in batch:
                left = settings.time_limit_s - (clock() - start)
                if left <= 0:
                    skipped.append(cand.name if i == 0 else f"{cand.name} (pass {i + 1})")
                    continue
                d = os.path.join(out_dir, _dir_name(cand) + (f"-pass{i + 1}" if i else ""))
                prun = profile_run_config(run, cand, settings.profile_steps, left, d)
                log.info(
                    "placement=auto: profiling %s (%d steps)", cand.name, settings.profile_steps
                )
                entry(prun, d)
                reading = read_run(d, WARMUP_STEPS)
                kept = best.get(cand.name)
                if kept is None or reading.seconds_per_step < kept[1].seconds_per_step:
                    best[cand.name] = (cand, reading)
    finally:
        cluster.shutdown()
    made = [best[c.name] for c in specs if c.name in best]
    if not made:
        raise ResourceError(
            f"placement.auto.time_limit_s={settings.time_limit_s}: no profiling run fitted in "
            f"the limit; raise it"
        )
    costs = _fit(run, made)
    runs = tuple(
        {
            "layout": c.name,
            "actor_devices": c.actor_devices,
            "rollout_devices": c.rollout_devices,
            "stages": c.stages,
            "reading": r.to_dict(),
        }
        for c, r in made
    )
    return Profile(
        key=profile_key(run),
        runner=run.runner,
        costs=costs,
        runs=runs,
        source="measured",
        seconds=clock() - start,
        created=datetime.datetime.now().isoformat(timespec="seconds"),
        skipped=tuple(skipped),
    )


def _first_valid(run: Any, slot: Sequence[Candidate]) -> Candidate | None:
    """The first layout of a slot that passes the checks training makes."""
    from rltrain.autoplace.search import check_candidate

    for cand in slot:
        if not check_candidate(run, _profiled_as(cand))[0]:
            return cand
    return None


def _profiled_as(cand: Candidate) -> Candidate:
    """A fused profiling layout is checked as taking turns (``fuse=auto`` falls back to it)."""
    return dataclasses.replace(cand, fused=False) if cand.fused else cand


def _fit(run: Any, made: Sequence[tuple[Candidate, RunReading]]) -> ReasoningCosts | EmbodiedCosts:
    if registry.runner(run).steps_env:
        return fit_embodied(made, run.env.num_envs, run.env.rollout_steps)
    return fit_reasoning(made, old_logprob_passes(run), run.algorithm.ppo_epochs)


def old_logprob_passes(run: Any) -> tuple[int, int]:
    """The actor's pi_old passes per step (``algorithm.old_logprobs``) in the profiling runs,
    which are synchronous, and in a candidate with ``trainer.max_staleness=1``."""
    from rltrain.config.numerics import old_logprob_pass

    def at(staleness: int) -> int:
        trainer = dataclasses.replace(run.trainer, max_staleness=staleness)
        return int(old_logprob_pass(dataclasses.replace(run, trainer=trainer)))

    return at(0), at(1)


def _dir_name(cand: Candidate) -> str:
    return "".join(ch if ch.isalnum() or ch in "-=" else "_" for ch in cand.name)


def get_profile(run: Any, settings: AutoSettings, out_dir: str) -> Profile:
    """The run's profile: from the cache when there is one (and ``reprofile`` is off), else
    measured and cached.

    Args:
        run: the base run config.
        settings: ``placement.auto.*``.
        out_dir: where profiling runs write when it measures.

    Returns:
        The profile (``source`` says which).

    Raises:
        See :func:`measure`.
    """
    key = profile_key(run)
    if not settings.reprofile:
        cached = load_cached(settings, key)
        if cached is not None:
            return cached
    profile = measure(run, settings, out_dir)
    path = save_cached(settings, profile)
    return dataclasses.replace(profile, path=path)
