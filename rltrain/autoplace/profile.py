"""Profiling: short real runs of a few layouts, read back and fitted, cached.

The runs go through the runners' own entry points (:func:`rltrain.runners.reasoning.
run_reasoning`, :func:`rltrain.runners.embodied.run_embodied`) on the configured cluster: real
workers on the real (or simulated) devices. Each is bounded by ``placement.auto.profile_steps``
steps and what is left of ``placement.auto.time_limit_s`` (``trainer.time_budget_s``, which
bounds the run's training loop, not its workers' start-up and shutdown); a run that would start
after the limit is skipped and the fit uses the runs made. A run that fails is reported and its
slot's next layout is run instead. All runs share one Ray: a local one is started once (and
stopped after), an existing one is joined.

Profiles are cached under ``placement.auto.cache_dir`` by :func:`profile_key`: the model, the
task, the cluster, and every setting that changes how long a stage takes (batch sizes, lengths,
engines, latency knobs); not the placement, which is what the profile serves to choose. A
profile the time limit cut short is never cached over a complete one, and a cached one that was
cut short is measured again.
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
from rltrain.autoplace.readings import RunReading, read_metrics, read_run
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
        path: the cache file ("" when it was not cached).
        skipped: profiling layouts the time limit left out: not run, or stopped before a timed
            step.
        failed: ``"<layout>: <error>"`` of each profiling run that failed.
        steps: ``placement.auto.profile_steps`` it was measured with (0: not recorded).
        passes: ``placement.auto.profile_passes`` it was measured with (0: not recorded).
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
    failed: tuple[str, ...] = ()
    steps: int = 0
    passes: int = 0

    @property
    def complete(self) -> bool:
        """Whether the time limit left no profiling layout out."""
        return not self.skipped

    def how(self) -> str:
        """The profiling settings it was measured with, in words ("" when not recorded)."""
        if not self.steps:
            return ""
        return (
            f"placement.auto.profile_steps={self.steps}, "
            f"placement.auto.profile_passes={self.passes}"
        )

    def gaps(self) -> list[str]:
        """Lines saying which profiling layouts were left out and why (none when none)."""
        lines = []
        if self.skipped:
            lines.append(
                "  skipped at placement.auto.time_limit_s (raise it to measure them): "
                + ", ".join(self.skipped)
            )
        lines += [f"  failed: {f}" for f in self.failed]
        return lines

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
            "failed": list(self.failed),
            "profile_steps": self.steps,
            "profile_passes": self.passes,
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
            failed=tuple(d.get("failed", ())),
            steps=int(d.get("profile_steps", 0)),
            passes=int(d.get("profile_passes", 0)),
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
        ResourceError: no profiling run recorded a timed step within the limit, or every one
            failed (each failure named).
    """
    from rltrain.scheduler import Cluster

    entry = entry or _entry(run.runner)
    slots = profile_candidates(
        run.runner, node_devices(run), run.env.pipeline_stage_num, run.env.num_envs
    )
    start = clock()
    firsts = [_first_valid(run, slot) for slot in slots]
    if all(c is None for c in firsts):
        raise ConfigError(
            "placement=auto: no layout to profile passes the checks training makes (every "
            "layout of node 0's devices is refused): lower the memory the run needs or give "
            "the cluster more devices; python -m rltrain mode=plan placement=collocated shows "
            "why"
        )
    # each slot from its first valid layout: the rest are the fall-backs of a failed run
    runnable = [list(sl[sl.index(c) :]) for sl, c in zip(slots, firsts, strict=True) if c]
    cluster = Cluster.start(run.cluster)  # one Ray for every profiling run
    try:
        made = profile_layouts(run, settings, out_dir, runnable, entry, clock, start)
    finally:
        cluster.shutdown()
    if not made.runs:
        raise ResourceError(
            f"placement=auto: no profiling run recorded a timed step ({made.why_none(settings)}); "
            f"the runs are under {out_dir}"
        )
    costs = _fit(run, made.runs)
    runs = tuple(
        {
            "layout": c.name,
            "actor_devices": c.actor_devices,
            "rollout_devices": c.rollout_devices,
            "stages": c.stages,
            "reading": r.to_dict(),
        }
        for c, r in made.runs
    )
    return Profile(
        key=profile_key(run),
        runner=run.runner,
        costs=costs,
        runs=runs,
        source="measured",
        seconds=clock() - start,
        created=datetime.datetime.now().isoformat(timespec="seconds"),
        skipped=made.skipped,
        failed=made.failed,
        steps=settings.profile_steps,
        passes=settings.profile_passes,
    )


@dataclass(frozen=True)
class Measured:
    """What the profiling runs gave.

    Attributes:
        runs: ``(layout, reading)`` of each layout measured, in slot order.
        skipped: layouts the time limit left out (see :attr:`Profile.skipped`).
        failed: ``"<layout>: <error>"`` of each run that failed.
    """

    runs: tuple[tuple[Candidate, RunReading], ...]
    skipped: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()

    def why_none(self, settings: AutoSettings) -> str:
        """Why no layout was measured, and the fix."""
        why = [f"failed: {f}" for f in self.failed]
        if self.skipped:
            why.append(
                f"cut short by placement.auto.time_limit_s={settings.time_limit_s}: "
                f"{', '.join(self.skipped)}; raise it"
            )
        return "; ".join(why)


#: Characters of a failed run's error kept in the profile (its first line).
ERROR_CHARS = 300


def profile_layouts(
    run: Any,
    settings: AutoSettings,
    out_dir: str,
    slots: Sequence[Sequence[Candidate]],
    entry: Callable[[Any, str], dict],
    clock: Callable[[], float] = time.monotonic,
    start: float | None = None,
) -> Measured:
    """Run the profiling layouts on a started cluster and read them back.

    Each slot's first layout runs; when its run fails (the entry raises, or it recorded no
    step), the failure is kept and the slot's next layout that passes the checks runs instead.
    No run starts once ``settings.time_limit_s`` has passed since ``start``; one that its time
    budget stopped within its warm-up step counts as left out by the limit. With
    ``settings.profile_passes > 1`` the measured layouts run again (every other pass in
    reverse order) and each keeps its fastest reading, so load that comes and goes on a shared
    machine does not decide the profile.

    Args:
        run: the base run config.
        settings: ``placement.auto.*``.
        out_dir: where the runs write (one directory per run).
        slots: the layouts of each slot, the first to run first (each passes the checks).
        entry: ``(run config, run directory) -> summary``: drives one run.
        clock: the clock the time limit is kept with.
        start: the clock's reading when profiling began (default: now).

    Returns:
        The readings and what was left out.
    """
    start = clock() if start is None else start
    best: dict[str, tuple[Candidate, RunReading]] = {}
    skipped: list[str] = []
    failed: list[str] = []

    def attempt(cand: Candidate, i: int) -> str:
        """One profiling run: ``ok``, ``skipped`` (the time limit) or ``failed``."""
        tag = cand.name if i == 0 else f"{cand.name} (pass {i + 1})"
        left = settings.time_limit_s - (clock() - start)
        if left <= 0:
            skipped.append(tag)
            return "skipped"
        d = os.path.join(out_dir, _dir_name(cand) + (f"-pass{i + 1}" if i else ""))
        prun = profile_run_config(run, cand, settings.profile_steps, left, d)
        log.info("placement=auto: profiling %s (%d steps)", cand.name, settings.profile_steps)
        try:
            entry(prun, d)
            reading = read_run(d, WARMUP_STEPS)
        except Exception as exc:  # noqa: BLE001 - one layout's failure leaves the others usable
            if _stopped_in_warmup(d):
                skipped.append(f"{tag} (stopped within its warm-up step)")
                return "skipped"
            failed.append(f"{tag}: {_first_line(exc)}")
            log.warning("placement=auto: profiling %s failed: %s", cand.name, failed[-1])
            return "failed"
        kept = best.get(cand.name)
        if kept is None or reading.seconds_per_step < kept[1].seconds_per_step:
            best[cand.name] = (cand, reading)
        return "ok"

    measured: list[Candidate] = []
    for slot in slots:
        for j, cand in enumerate(slot):
            if j and not _passes(run, cand):
                continue  # a fall-back the checks refuse
            outcome = attempt(cand, 0)
            if outcome == "ok":
                measured.append(cand)
            if outcome != "failed":
                break
    for i in range(1, max(settings.profile_passes, 1)):
        for cand in measured if i % 2 == 0 else measured[::-1]:
            attempt(cand, i)
    return Measured(tuple(best[c.name] for c in measured), tuple(skipped), tuple(failed))


def _stopped_in_warmup(run_dir: str) -> bool:
    """Whether a run that could not be read back took its warm-up step only (its time budget
    stopped it: a profiling run takes at least two steps otherwise)."""
    try:
        return 0 < len(read_metrics(run_dir)) <= WARMUP_STEPS
    except ConfigError:
        return False


def _first_line(exc: BaseException) -> str:
    """An error's type and first line, shortened (a worker's traceback follows it)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    if len(text) > ERROR_CHARS:
        text = text[: ERROR_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}"


def _first_valid(run: Any, slot: Sequence[Candidate]) -> Candidate | None:
    """The first layout of a slot that passes the checks training makes."""
    return next((cand for cand in slot if _passes(run, cand)), None)


def _passes(run: Any, cand: Candidate) -> bool:
    """Whether a profiling layout passes the checks training makes."""
    from rltrain.autoplace.search import check_candidate

    return not check_candidate(run, _profiled_as(cand))[0]


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
    """The run's profile: from the cache when there is a complete one (and ``reprofile`` is
    off), else measured and cached. A measured profile the time limit cut short is not cached
    over a complete one (it is returned uncached, ``path`` empty); a cached one that was cut
    short is measured again.

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
        cached = reusable_cached(settings, key)
        if cached is not None:
            return cached
    return store(settings, measure(run, settings, out_dir))


def reusable_cached(settings: AutoSettings, key: str) -> Profile | None:
    """The cached profile of ``key`` when it is complete; None when there is none or the time
    limit cut it short (then it is to be measured again, with the limit the run has now).

    Args:
        settings: ``placement.auto.*``.
        key: the profile's key (:func:`profile_key`).

    Returns:
        The cached profile, or None.
    """
    cached = load_cached(settings, key)
    if cached is None or cached.complete:
        return cached
    log.warning(
        "placement=auto: the cached profile %s left out %s (placement.auto.time_limit_s): "
        "measuring again",
        cached.path,
        ", ".join(cached.skipped),
    )
    return None


def store(settings: AutoSettings, profile: Profile) -> Profile:
    """Cache a measured profile, unless the time limit cut it short and the cache holds a
    complete one of the same key (which stays).

    Args:
        settings: ``placement.auto.*``.
        profile: the measured profile.

    Returns:
        The profile with ``path`` set to its cache file, or empty when it was not cached.
    """
    cached = load_cached(settings, profile.key)
    if not profile.complete and cached is not None and cached.complete:
        log.warning(
            "placement=auto: this profile left out %s (placement.auto.time_limit_s=%s): not "
            "cached over the complete one at %s",
            ", ".join(profile.skipped),
            settings.time_limit_s,
            cached.path,
        )
        return dataclasses.replace(profile, path="")
    return dataclasses.replace(profile, path=save_cached(settings, profile))
