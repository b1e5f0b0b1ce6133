"""``placement=auto``'s profile cache, as the simulator reads it for calibration.

A profile is cached under ``placement.auto.cache_dir`` (default ``~/.cache/rltrain/profiles``)
by :func:`profile_key`: the model, the task, the cluster, and every setting that changes how long
a stage takes (never the placement). :func:`cached_costs` returns a cached profile's fitted
costs for a run, which :func:`rltrain.whatif.calibrate.from_profile` turns into calibration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

#: Bumped when the profile's content changes meaning (older cache files are then ignored).
#: 3: ``train`` is timed from the actor's lease entry to the update's end, the sync apart.
PROFILE_VERSION = 3
#: Config sections whose values change how long a stage takes (the cache key).
TIMING_SECTIONS = (
    "simulate",
    "model",
    "task",
    "cluster",
    "actor",
    "rollout",
    "reward",
    "reference",
    "critic",
    "inference",
    "algorithm",
    "env",
    "weight_sync",
    "optimizer",
    "tools",
)
#: Where profiles are cached when ``placement.auto.cache_dir`` is null.
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "rltrain", "profiles")


def _section(run: Any, name: str) -> Any:
    value = getattr(run, name, None)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def profile_key(run: Any) -> str:
    """The cache key: a readable prefix (runner, model, task, cluster) and a hash of every
    setting that changes stage times.

    Args:
        run: the run config.

    Returns:
        A file-name-safe key.
    """
    m, c = run.model, run.cluster
    model = os.path.basename(str(m.path).rstrip("/")) if m.path else f"{m.family}-h{m.hidden_size}"
    task = run.task.name if run.task.name != "gym" else run.task.env_id
    extra = sorted(
        n.strip()
        for k in run.placement.component_placement
        for n in str(k).split(",")
        if n.strip() not in ("actor", "rollout", "env")
    )
    data = {s: _section(run, s) for s in TIMING_SECTIONS}
    data.update(
        runner=run.runner,
        train_batch_size=run.trainer.train_batch_size,
        components=extra,
        version=PROFILE_VERSION,
    )
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    devices = c.devices_per_node if isinstance(c.devices_per_node, int) else "mixed"
    prefix = f"{run.runner}-{model}-{task}-{c.num_nodes}x{devices}"
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in prefix)
    return f"{safe}-{digest[:16]}"


def cache_dir(run: Any) -> str:
    """``placement.auto.cache_dir`` with ``~`` and variables expanded."""
    auto = getattr(getattr(run, "placement", None), "auto", None)
    folder = getattr(auto, "cache_dir", None) or DEFAULT_CACHE_DIR
    return os.path.expandvars(os.path.expanduser(folder))


def cached_costs(run: Any, unsized: Any = None) -> tuple[dict[str, Any], str] | None:
    """The cached profile's ``costs`` for this run and its path, or None (none, unreadable,
    another version).

    ``placement=auto`` keys its profile with the micro-batch sizes the config leaves null still
    null (each layout sizes its own), while a planned run has them chosen for its layout: when
    the run's own key finds nothing, the key of ``unsized`` (the run before those sizes were
    chosen; the sizes the user set stay in it) is tried.

    Args:
        run: the run config (its micro-batch sizes chosen or not).
        unsized: ``run`` before its null micro-batch sizes were chosen, or None.

    Returns:
        ``(costs, path)``, or None.
    """
    runs = [run] if unsized is None else [run, unsized]
    for key in dict.fromkeys(profile_key(r) for r in runs):
        found = _read_costs(os.path.join(cache_dir(run), f"{key}.json"), key)
        if found is not None:
            return found
    return None


def _read_costs(path: str, key: str) -> tuple[dict[str, Any], str] | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if data.get("version") != PROFILE_VERSION or data.get("key") != key:
        return None
    costs = data.get("costs")
    return (costs, path) if isinstance(costs, dict) else None
