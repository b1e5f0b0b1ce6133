"""Atomic checkpoints on a local path or any fsspec URI.

A checkpoint is a directory ``step-000120/`` under the checkpoint root, holding the model in
Hugging Face format (safetensors), the optimizer, each actor rank's random states (``rng/``),
the critic's model, optimizer and random states (``critic/``, PPO), the data cursor and the step.
With LoRA (``actor.lora.rank > 0``) ``model/`` holds the base weights and ``adapter/`` the trained
adapter in peft's format (``adapter_config.json``, ``adapter_model.safetensors``); the optimizer
holds the adapters' state only (:mod:`rltrain.backends.lora`). It is
written into a temporary directory first and renamed into place; then the ``latest`` pointer is
replaced. A crash at any moment leaves the previous ``latest`` pointing at a complete checkpoint.

Every checkpoint carries a manifest (``manifest.json``: each file's size, and its SHA-256 on
local storage), written last, before the rename. :meth:`CheckpointManager.latest` verifies the
newest checkpoint against it and falls back to the previous complete one when a file is missing,
truncated or corrupted, saying which file is bad; a checkpoint directory that cannot be written is
a :class:`~rltrain.errors.ResourceError` naming the path, with the previous checkpoint intact.

Workers on other nodes cannot write into the driver's run directory: on a multi-node cluster
point ``trainer.checkpoint_dir`` at shared storage (NFS, or an fsspec URI such as ``s3://``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import posixpath
import re
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec

from rltrain.config.files import CHECKPOINT_STEP
from rltrain.errors import ConfigError, ResourceError, WorkerError, worker_cause

STATE_FILE = "trainer_state.json"
MANIFEST = "manifest.json"
LATEST = "latest"

log = logging.getLogger("rltrain")


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint being written: workers write into ``path``; :meth:`commit` publishes it."""

    root: str
    step: int
    path: str  # the temporary directory to write into

    @property
    def final_path(self) -> str:
        return posixpath.join(self.root, f"step-{self.step:06d}")


class CheckpointManager:
    """Writes, publishes and finds checkpoints under one root (a path or fsspec URI).

    Args:
        root: the checkpoint directory (``trainer.checkpoint_dir``).
        keep: how many published checkpoints to keep (older ones are deleted); 0 keeps all.
    """

    def __init__(self, root: str, keep: int = 2) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(root)
        self.url = root
        self.keep = keep

    def begin(self, step: int) -> PendingCheckpoint:
        """Create a fresh temporary directory for the checkpoint of ``step``.

        Raises:
            ResourceError: the checkpoint directory cannot be written.
        """
        tmp = posixpath.join(self.root, f".tmp-step-{step:06d}-{_temporary_tag()}")
        with self._writing(f"create {tmp}"):
            self.fs.makedirs(tmp, exist_ok=True)
        return PendingCheckpoint(self.root, step, tmp)

    def commit(self, pending: PendingCheckpoint, state: dict[str, Any]) -> str:
        """Write the trainer state and the manifest, move the directory into place and point
        ``latest`` at it.

        Args:
            pending: the checkpoint whose files the workers have written.
            state: JSON-serialisable trainer state (step, data cursor, model fingerprint, ...).

        Returns:
            The published checkpoint's path.

        Raises:
            ResourceError: the checkpoint directory cannot be written (the previous checkpoint
                and ``latest`` are left as they were).
        """
        from rltrain.scheduler.interrupts import deferred_interrupts

        # Ctrl-C waits for the rename and the pointer: the checkpoint is published whole or not
        # at all, and no temporary file is left behind.
        self._refuse_foreign(pending.final_path)
        with deferred_interrupts(), self._writing(f"write checkpoint {pending.final_path}"):
            with self.fs.open(posixpath.join(pending.path, STATE_FILE), "w") as f:
                json.dump({**state, "step": pending.step}, f, indent=1)
            manifest = self._manifest(pending.path)
            with self.fs.open(posixpath.join(pending.path, MANIFEST), "w") as f:
                json.dump(manifest, f, indent=1)
            final = pending.final_path
            if self.fs.exists(final):
                self.fs.rm(final, recursive=True)
            self.fs.mv(pending.path, final, recursive=True)
            tmp_latest = posixpath.join(self.root, f".{LATEST}-{_temporary_tag()}")
            with self.fs.open(tmp_latest, "w") as f:
                f.write(posixpath.basename(final))
            self.fs.mv(tmp_latest, posixpath.join(self.root, LATEST))
        self._prune(final)
        return self._url(final)

    def discard_unpublished(self, own: bool = False) -> list[str]:
        """Remove what interrupted or failed writes left: temporary checkpoint directories and
        pointer files that were never published (the published ones are untouched).

        In a directory other runs may share (``trainer.checkpoint_dir``), each temporary name
        carries its writer (host, PID namespace, pid, process start time): this process's own
        and those of a process of this host and namespace that is gone are removed; another
        live process's (a run sharing the directory, writing now), another host's or another
        container's are kept. Call it only while this process writes no checkpoint.

        Args:
            own: the directory is the run directory's own ``checkpoints/``, which no other run
                writes into: every temporary write there is removed, whoever wrote it (a
                driver requeued onto another node or into a new container left it).

        Returns:
            The removed paths.
        """
        if not self.fs.exists(self.root):
            return []
        temporary = [
            p
            for p in self.fs.ls(self.root, detail=False)
            if posixpath.basename(p).startswith((".tmp-step-", f".{LATEST}-"))
        ]
        stale = [p for p in temporary if own or _writer_gone(posixpath.basename(p))]
        for path in stale:
            self.fs.rm(path, recursive=True)
        kept = [posixpath.basename(p) for p in temporary if p not in stale]
        if kept:
            log.warning(
                "kept %d temporary checkpoint write(s) in %s whose writer may still be running "
                "(another run, host or container): %s; remove them by hand once no run writes "
                "there",
                len(kept),
                self.root,
                ", ".join(kept),
            )
        return stale

    def latest(self, experiment: dict[str, Any] | None = None) -> str | None:
        """Path of the newest complete, intact checkpoint, or None when there is none.

        The one ``latest`` points at is verified against its manifest; when it is damaged the
        newest intact older one is taken, and the bad file is named in the log. A checkpoint
        published after the one ``latest`` names (a driver killed between moving it into place
        and moving the pointer) is taken first when it records the experiment of the pointer's
        checkpoint (or ``experiment``); without a pointer the published checkpoints of
        ``experiment`` are the candidates, newest first (every published one when none records
        it, or without ``experiment``).

        Args:
            experiment: the experiment the caller continues (:func:`experiment_identity`), for
                checkpoints past a stale or damaged pointer; None: the pointer's own.
        """
        for path in self.candidates(experiment):
            problem = self.verify(path)
            if problem is None:
                return self._url(path)
            log.warning("checkpoint %s is unusable (%s); trying the previous one", path, problem)
        return None

    def candidates(self, experiment: dict[str, Any] | None = None) -> list[str]:
        """The checkpoints :meth:`latest` tries, in its order (unverified).

        Args:
            experiment: as for :meth:`latest`.
        """
        newest_first = list(reversed(self.published()))
        name = self._pointer()
        if name is None:
            if experiment is None:
                return newest_first
            # in a directory shared by experiments another's checkpoint may be the newest;
            # with none of this experiment, the newest is returned for the caller to refuse.
            # One whose state cannot be read stays: verifying it names the bad file
            norm = _normal(experiment)
            mine = [p for p in newest_first if self._experiment(p) in (None, norm)]
            return mine or newest_first
        pointed = posixpath.join(self.root, name)
        lineage = _normal(experiment) if experiment is not None else self._experiment(pointed)
        # a later step directory continues this lineage only when it records its experiment:
        # else it is another run's (a directory shared by experiments)
        later = [
            p
            for p in newest_first
            if posixpath.basename(p) > name
            and lineage is not None
            and self._experiment(p) == lineage
        ]
        older = [p for p in newest_first if posixpath.basename(p) < name]
        return [*later, pointed, *older]

    def newest(self, record: dict[str, Any]) -> str | None:
        """The newest intact checkpoint written with ``record`` (its experiment and training
        settings, :func:`training_record`), whatever ``latest`` points at: a run's own
        checkpoints in a directory other runs may write into at the same time.

        Args:
            record: what the checkpoint must record.

        Returns:
            Its path, or None when there is none.
        """
        want = _normal(record)
        for path in reversed(self.published()):
            state = self._state(path) or {}
            mine = _normal(
                {"experiment": state.get("experiment"), "settings": state.get("settings")}
            )
            if mine == want and self.verify(path) is None:
                return self._url(path)
        return None

    def _pointer(self) -> str | None:
        """The step directory ``latest`` names, or None without a readable pointer."""
        pointer = posixpath.join(self.root, LATEST)
        try:
            with self.fs.open(pointer) as f:
                name = f.read(64).decode(errors="replace").strip()
        except (OSError, IsADirectoryError):
            return None
        return name if CHECKPOINT_STEP.fullmatch(name) else None

    def _state(self, path: str) -> dict[str, Any] | None:
        try:
            with self.fs.open(posixpath.join(path, STATE_FILE)) as f:
                state = json.load(f)
        except (ValueError, OSError):
            return None
        return state if isinstance(state, dict) else None

    def _experiment(self, path: str) -> Any:
        """The experiment a checkpoint records (JSON-normalised), or None."""
        recorded = (self._state(path) or {}).get("experiment")
        return None if recorded is None else _normal(recorded)

    def verify(self, path: str) -> str | None:
        """What is wrong with a published checkpoint, or None when it is intact.

        Checks the trainer state parses and every file the manifest lists has its size (and,
        on local storage, its SHA-256). Checkpoints written before manifests existed are only
        checked for their state file.
        """
        fs, root = fsspec.core.url_to_fs(path) if "://" in path else (self.fs, path)
        state_path = posixpath.join(root, STATE_FILE)
        if not fs.exists(state_path):
            return f"{STATE_FILE} is missing"
        try:
            with fs.open(state_path) as f:
                json.load(f)
        except (ValueError, OSError) as exc:
            return f"{state_path} cannot be read ({exc})"
        manifest_path = posixpath.join(root, MANIFEST)
        if not fs.exists(manifest_path):
            return None
        try:
            with fs.open(manifest_path) as f:
                manifest = json.load(f)
        except (ValueError, OSError) as exc:
            return f"{manifest_path} cannot be read ({exc})"
        local = _is_local(fs)
        for rel, want in manifest.items():
            file = posixpath.join(root, rel)
            if not fs.exists(file):
                return f"{file} is missing"
            size = fs.size(file)
            if size != want["size"]:
                return f"{file} has {size} bytes, the manifest says {want['size']} (truncated?)"
            if local and "sha256" in want and _sha256(file) != want["sha256"]:
                return f"{file} does not match its SHA-256 in the manifest (corrupted)"
        return None

    def _manifest(self, path: str) -> dict[str, dict[str, Any]]:
        local = _is_local(self.fs)
        out = {}
        for file in sorted(self.fs.find(path)):
            rel = posixpath.relpath(file, path)
            entry: dict[str, Any] = {"size": self.fs.size(file)}
            if local:
                entry["sha256"] = _sha256(file)
            out[rel] = entry
        return out

    def published(self) -> list[str]:
        """Published checkpoint directories, oldest first: ``step-NNNNNN`` directories whose
        trainer state or manifest shows a run wrote them (nothing else is pruned or replaced)."""
        if not self.fs.exists(self.root):
            return []
        return sorted(
            p
            for p in self.fs.ls(self.root, detail=False)
            if CHECKPOINT_STEP.fullmatch(posixpath.basename(p)) and self._ours(p)
        )

    def _ours(self, path: str) -> bool:
        return any(self.fs.exists(posixpath.join(path, mark)) for mark in (STATE_FILE, MANIFEST))

    def _refuse_foreign(self, final: str) -> None:
        """Refuse to replace a checkpoint or a ``latest`` pointer that no run wrote.

        Raises:
            ResourceError: ``final`` or ``latest`` exists and is not rltrain's.
        """
        pointer = posixpath.join(self.root, LATEST)
        foreign = [final] if self.fs.exists(final) and not self._ours(final) else []
        if self.fs.exists(pointer):
            try:
                with self.fs.open(pointer) as f:
                    held = f.read(64).decode(errors="replace").strip()
            except (OSError, IsADirectoryError):
                held = ""
            if CHECKPOINT_STEP.fullmatch(held) is None:
                foreign.append(pointer)
        if foreign:
            raise ResourceError(
                f"not writing checkpoint {final}: {', '.join(foreign)} exists and rltrain did not "
                f"write it; point trainer.checkpoint_dir ({self.url!r}) at a new or empty directory"
            )

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Turn a storage failure into an error that names the directory and the fix."""
        try:
            yield
        except OSError as exc:
            raise ResourceError(
                f"cannot {what} ({exc.strerror or exc}): make the checkpoint directory "
                f"{self.url!r} writable (trainer.checkpoint_dir), or point trainer.checkpoint_dir "
                f"elsewhere; the previous checkpoint is intact"
            ) from exc

    def resolve(self, resume: str | None) -> str | None:
        """Turn ``trainer.resume`` (null, ``auto`` or a path) into a checkpoint path or None.

        Raises:
            ConfigError: when a given path holds no complete checkpoint.
        """
        if resume is None:
            return None
        if resume == "auto":
            return self.latest()
        fs, path = fsspec.core.url_to_fs(resume)
        if fs.exists(posixpath.join(path, LATEST)) and not fs.exists(
            posixpath.join(path, STATE_FILE)
        ):
            return CheckpointManager(resume).latest()
        if not fs.exists(posixpath.join(path, STATE_FILE)):
            raise ConfigError(
                f"trainer.resume={resume!r} holds no complete checkpoint ({STATE_FILE} missing): "
                f"give a step-NNNNNN directory, its parent, or resume=auto"
            )
        problem = self.verify(resume)
        if problem is not None:
            raise ConfigError(
                f"trainer.resume={resume!r} is damaged: {problem}; give another checkpoint "
                f"(its parent directory picks the newest intact one) or resume=auto"
            )
        return resume

    def _prune(self, published_now: str) -> None:
        """Delete all but the newest ``keep`` checkpoints, never the one just published."""
        if self.keep <= 0:
            return
        for old in self.published()[: -self.keep]:
            if old != published_now:
                self.fs.rm(old, recursive=True)

    def _url(self, path: str) -> str:
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return path if protocol in ("file", "local") else f"{protocol}://{path}"


def _normal(value: Any) -> Any:
    """``value`` as it reads back from a trainer state (tuples as lists, keys as strings)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


# ------------------------------------------------------------------ writers of temporary files
#: ``.tmp-step-000006-<random>-h<host>-n<pid namespace>-p<pid>-s<start>`` /
#: ``.latest-<random>-h...``: who wrote it (``-n`` is absent where the namespace is unreadable,
#: and in names written before it was recorded).
_WRITER = re.compile(r"-h(?P<host>[0-9a-f]{8})(?:-n(?P<ns>\d+))?-p(?P<pid>\d+)-s(?P<start>\d+)$")


def _host_hash() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


#: Where the kernel reports processes (Linux).
_PROC = "/proc"


def _pid_namespace() -> int | None:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``), None when unknown."""
    try:
        return os.stat(f"{_PROC}/self/ns/pid").st_ino
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux); 0 for a zombie; None when
    ``/proc`` does not show it (no ``/proc``, the pid is gone, or ``/proc`` hides it: another
    user's process under ``hidepid``, another namespace's ``/proc``)."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == b"Z":
        return 0
    return int(fields[19])  # field 22 of proc_pid_stat(5); fields[0] is field 3


def _temporary_tag() -> str:
    """A unique suffix for a temporary name that names its writer: this host, PID namespace
    and process."""
    pid, namespace = os.getpid(), _pid_namespace()
    ns = "" if namespace is None else f"-n{namespace}"
    return f"{uuid.uuid4().hex[:8]}-h{_host_hash()}{ns}-p{pid}-s{_start_time(pid) or 0}"


def _writer_gone(name: str) -> bool:
    """Whether the temporary file or directory ``name`` in a directory other runs may share is
    safe to remove: written by this process (which writes none now) or by one of this host and
    PID namespace that is gone.

    A writer whose liveness cannot be seen from here is kept: one naming no writer, another
    host's, another PID namespace's (a container sharing the host's name), or an old name
    without its namespace whose pid is this process's but whose start time differs. A pid alive
    again for another process (reuse) is told apart by its start time where the system reports
    it; where it does not, a live pid counts as the writer (kept). An old name without its
    namespace is read as this namespace's.
    """
    found = _WRITER.search(name)
    if found is None or found["host"] != _host_hash():
        return False
    here = _pid_namespace()
    if found["ns"] is not None and (here is None or int(found["ns"]) != here):
        return False  # another container's process: its pids are not this namespace's
    pid, start = int(found["pid"]), int(found["start"])
    if pid == os.getpid():
        # in this namespace an earlier process of this pid is gone; without the namespace in
        # the name, only the start time tells this process from another container's
        return found["ns"] is not None or start == (_start_time(pid) or 0)
    now = _start_time(pid)
    if now is None:  # not shown in /proc (gone, or hidden from it): ask the kernel
        return not _pid_exists(pid)
    return now == 0 or (start != 0 and now != start)


def _pid_exists(pid: int) -> bool:
    """Whether ``pid`` names a process of this PID namespace (True when that cannot be told)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process, alive
        return True
    return True


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _sha256(path: str, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_root(run: Any, run_dir: str) -> str:
    """The run's checkpoint directory: ``trainer.checkpoint_dir``, else ``checkpoints/`` in
    its run directory."""
    return run.trainer.checkpoint_dir or os.path.join(run_dir, "checkpoints")


def read_state(checkpoint: str) -> dict[str, Any]:
    """Read the trainer state of a published checkpoint."""
    fs, path = fsspec.core.url_to_fs(checkpoint)
    with fs.open(posixpath.join(path, STATE_FILE)) as f:
        return json.load(f)


# ----------------------------------------------------------------------------------- resuming
#: The config sections that make two runs the same experiment: a checkpoint of one is a valid
#: start for the other, and ``trainer.resume=auto`` continues only checkpoints of its own
#: experiment. Placement and cluster may change between invocations (moving workers).
EXPERIMENT_KEYS = (
    "runner",
    "seed",
    "model",
    "task",
    "algorithm",
    "reward.kind",
    "reward.model_path",
)

#: Training settings a resumed run may change (a learning-rate schedule by hand, a longer
#: response budget, more samples): each difference from the checkpoint's is printed before
#: the run continues. ``trainer.total_steps`` is left out: extending a run is the common case.
SETTING_KEYS = (
    "optimizer",
    "critic.lr",
    "rollout.n_samples_per_prompt",
    "rollout.temperature",
    "rollout.top_p",
    "rollout.max_new_tokens",
    "trainer.train_batch_size",
    "trainer.max_staleness",
    "trainer.partial_rollout",
    "actor.micro_batch_size",
    "actor.max_tokens_per_micro_batch",
    "actor.gradient_checkpointing",
    "env.num_envs",
    "env.rollout_steps",
    "env.lr_final_fraction",
)


@dataclass(frozen=True)
class Resume:
    """What ``trainer.resume`` resolved to.

    Attributes:
        path: the checkpoint to resume from, or None to start at step 0.
        note: one line saying what was found where (printed at start).
        differences: one line per training setting (:data:`SETTING_KEYS`) or, for a checkpoint
            named by path, experiment setting that differs from the checkpoint's (printed as
            warnings before the run continues).
    """

    path: str | None
    note: str = ""
    differences: tuple[str, ...] = ()


def model_fingerprint(run: Any) -> str:
    """What a reasoning checkpoint records of the model it holds (checked on resume).

    Under LoRA (``actor.lora.rank > 0``) the adapter's shape is part of it (``+lora-r8-q_proj,
    v_proj``): a LoRA checkpoint holds the base model and the adapter apart, so it cannot
    resume a full-training run, nor one with other adapters.
    """
    m = run.model
    if m.path:
        out = f"path:{m.path}"
    else:
        out = (
            f"{m.family}-h{m.hidden_size}-i{m.intermediate_size}-l{m.num_layers}-"
            f"a{m.num_heads}-kv{m.num_kv_heads}-{m.dtype}"
        )
    lora = run.actor.lora
    if lora.rank > 0:
        out += f"+lora-r{lora.rank}-" + ",".join(sorted(set(lora.target_modules)))
    return out


def _plain_run(config: Any) -> dict[str, Any] | None:
    """A run config (a RunConfig, or a composed config as Hydra saved it, possibly of an
    older rltrain) as plain, resolved data; None when it is not one."""
    from omegaconf import OmegaConf

    from rltrain.config.schema import RunConfig

    try:
        node = OmegaConf.merge(OmegaConf.structured(RunConfig), config)
        plain: Any = OmegaConf.to_container(node, resolve=True)
    except Exception:  # noqa: BLE001 - another program's or version's config: not ours
        return None
    model = plain.get("model") or {}
    if model.get("dtype") is None:  # null follows the checkpoint, as load_config decides it
        from rltrain.config.files import model_dtype

        model["dtype"] = model_dtype(model.get("path"), None)
    return plain


def _select(plain: dict[str, Any], key: str) -> Any:
    value: Any = plain
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def experiment_identity(config: Any) -> dict[str, Any] | None:
    """The identity of a run's experiment (:data:`EXPERIMENT_KEYS`, and LoRA's adapters).

    Args:
        config: a :class:`~rltrain.config.schema.RunConfig`, or a composed config as saved by
            Hydra (``.hydra/config.yaml``).

    Returns:
        Plain data; None when the config cannot be read as a run config.
    """
    plain = _plain_run(config)
    if plain is None:
        return None
    identity = {k: _select(plain, k) for k in EXPERIMENT_KEYS}
    lora = (plain.get("actor") or {}).get("lora") or {}
    if (lora.get("rank") or 0) > 0:  # adapters are another experiment's checkpoints
        identity["actor.lora"] = lora
    return identity


def experiment_key(config: Any) -> str | None:
    """:func:`experiment_identity` as a canonical JSON string (None when unreadable)."""
    identity = experiment_identity(config)
    return None if identity is None else json.dumps(identity, sort_keys=True, default=str)


def training_settings(config: Any) -> dict[str, Any]:
    """The run's :data:`SETTING_KEYS`, flattened (``{"optimizer.lr": 0.0003, ...}``)."""
    plain = _plain_run(config) or {}
    return dict(_flat({k: _select(plain, k) for k in SETTING_KEYS}))


def training_record(run: Any) -> dict[str, Any]:
    """What a checkpoint records of the run that wrote it (compared on resume)."""
    return {"experiment": experiment_identity(run), "settings": training_settings(run)}


def _flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], value


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``key: <checkpoint's> in the checkpoint, <now> now`` for every key whose value differs.

    Args:
        recorded: what the checkpoint recorded (nested or flat).
        now: the same for this run.
    """
    a, b = dict(_flat(recorded)), dict(_flat(now))
    return [
        f"{k}: {a.get(k)!r} in the checkpoint, {b.get(k)!r} now"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def _recorded(path: str) -> tuple[dict | None, dict | None]:
    """The experiment and training settings a checkpoint was written with.

    Read from its trainer state; a checkpoint that records none (written by an older rltrain)
    is read through the config of the run directory holding it, when there is one.
    """
    state = read_state(path)
    if "experiment" in state or "settings" in state:
        return state.get("experiment"), state.get("settings")
    hydra_config = os.path.join(os.path.dirname(os.path.dirname(path)), ".hydra", "config.yaml")
    if "://" in path or not os.path.isfile(hydra_config):
        return None, None
    from omegaconf import OmegaConf

    try:
        saved = OmegaConf.load(hydra_config)
    except Exception:  # noqa: BLE001 - unreadable: nothing recorded
        return None, None
    return experiment_identity(saved), training_settings(saved)


def _earlier_runs(run_dir: str) -> list[str]:
    """Run directories beside this one: ``outputs/<date>/<time>`` and ``<root>/<name>``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))
    found = glob.glob(os.path.join(root, "*", ".hydra", "config.yaml"))
    found += glob.glob(os.path.join(root, "*", "*", ".hydra", "config.yaml"))
    here = os.path.abspath(run_dir)
    dirs = {os.path.dirname(os.path.dirname(f)) for f in found}
    return sorted(d for d in dirs if os.path.abspath(d) != here)


@dataclass(frozen=True)
class _Found:
    """Earlier runs' checkpoints: the newest of this experiment, and the others passed over."""

    best: tuple[str, float] | None
    others: tuple[tuple[str, list[str]], ...]  # (checkpoint, how its experiment differs)


def _latest_of_experiment(run: Any, run_dir: str) -> _Found:
    """The newest checkpoint written by an earlier run of the same experiment.

    Each earlier run is judged by what its checkpoint records (else by its saved config).
    """
    from omegaconf import OmegaConf

    identity = experiment_identity(run)
    best: tuple[str, float] | None = None
    others: list[tuple[str, list[str]]] = []
    for other in _earlier_runs(run_dir):
        try:
            saved = OmegaConf.load(os.path.join(other, ".hydra", "config.yaml"))
        except Exception:  # noqa: BLE001 - an unreadable file is not a run of ours
            continue
        root = OmegaConf.select(saved, "trainer.checkpoint_dir") or os.path.join(
            other, "checkpoints"
        )
        latest = CheckpointManager(str(root)).latest() if os.path.isdir(str(root)) else None
        if latest is None:
            continue
        recorded = _recorded(latest)[0] or experiment_identity(saved)
        if recorded != identity:
            others.append((latest, differences(recorded or {}, identity or {})))
            continue
        when = os.path.getmtime(os.path.join(latest, STATE_FILE))
        if best is None or when > best[1]:
            best = (latest, when)
    return _Found(best, tuple(others))


def resolve_resume(run: Any, run_dir: str | None) -> Resume:
    """Decide, before Ray starts, which checkpoint ``trainer.resume`` means.

    ``auto`` takes the newest checkpoint of this run's checkpoint directory
    (``trainer.checkpoint_dir``, else ``<run dir>/checkpoints``); when that holds none and no
    ``trainer.checkpoint_dir`` is set, the newest checkpoint of an earlier run of the same
    experiment (:data:`EXPERIMENT_KEYS`) among the run directories beside this one — so running
    the same command again after a crash resumes, although Hydra gave it a new run directory.
    Only checkpoints of the same experiment are resumed by ``auto``; where the training
    settings (:data:`SETTING_KEYS`) differ from the checkpoint's, each difference is listed.
    A checkpoint named by path is resumed whatever its experiment (its differences listed),
    unless it holds another model.

    Args:
        run: the checked run config.
        run_dir: this run's output directory; None skips the search of earlier runs.

    Returns:
        The decision, with a line saying what was found where (also when nothing was).

    Raises:
        ConfigError: a given path holds no checkpoint, or one of another model; ``auto`` finds
            another experiment's checkpoint in this run's own checkpoint directory; the
            checkpoint is at or past ``trainer.total_steps`` (nothing left to train).
    """
    resume = run.trainer.resume
    if resume is None:
        return Resume(None)
    if resume != "auto":
        path = CheckpointManager(resume).resolve(resume)
        if path is None:
            raise ConfigError(
                f"trainer.resume={resume!r} holds no complete checkpoint yet: give a "
                f"step-NNNNNN directory, or resume=auto"
            )
        _check_model(run, path, "trainer.resume")
        _check_steps(run, path, f"trainer.resume={resume!r}")
        _check_later_checkpoints(run, run_dir, path)
        return _resume_from(run, path, f"resuming from {path}", identity_too=True)
    own = checkpoint_root(run, run_dir) if run_dir is not None else run.trainer.checkpoint_dir
    if own is not None:
        path = _own_latest(own, run)
        if path is not None:
            _check_model(run, path, "trainer.resume=auto found")
            _check_experiment(run, path, own)
            _check_steps(run, path, f"trainer.resume=auto found {path!r}")
            return _resume_from(run, path, f"trainer.resume=auto: resuming from {path}")
    found = _Found(None, ())
    if run.trainer.checkpoint_dir is None and run_dir is not None:
        found = _latest_of_experiment(run, run_dir)
        if found.best is not None:
            path = found.best[0]
            _check_steps(run, path, f"trainer.resume=auto found {path!r}")
            return _resume_from(
                run,
                path,
                f"trainer.resume=auto: resuming from {path}, the newest checkpoint of an "
                f"earlier run of this experiment",
            )
    return Resume(None, _nothing_found(run, run_dir, own, found))


def _own_latest(own: str, run: Any) -> str | None:
    """The newest intact checkpoint of the run's own checkpoint directory.

    Raises:
        ConfigError: every checkpoint there is damaged.
    """
    try:
        fs, root = fsspec.core.url_to_fs(own)
    except ImportError as exc:
        from rltrain.config.files import filesystem_missing

        raise ConfigError(filesystem_missing("trainer.checkpoint_dir", own, exc)) from None
    if not fs.exists(root):
        return None
    manager = CheckpointManager(own)
    identity = experiment_identity(run)
    path = manager.latest(identity)
    if path is None and manager.published():
        raise ConfigError(
            f"trainer.resume=auto: every checkpoint in {own} is damaged ("
            + "; ".join(f"{p}: {manager.verify(p)}" for p in manager.candidates(identity))
            + "): restore one, give trainer.resume=<path> of a good one, or "
            "trainer.resume=null to start fresh"
        )
    return path


def _resume_from(run: Any, path: str, note: str, identity_too: bool = False) -> Resume:
    """The decision to resume ``path``, with every setting that differs from its own."""
    step = read_state(path).get("step")
    experiment, settings = _recorded(path)
    diffs: list[str] = []
    if identity_too and experiment is not None:
        diffs += differences(experiment, experiment_identity(run) or {})
    if settings is not None:
        diffs += differences(settings, training_settings(run))
    lines = tuple(f"resuming with a setting changed: {d}" for d in diffs)
    if experiment is None and settings is None:
        lines = (f"{path} records no training settings: they are not compared",)
    return Resume(path, f"{note} (step {step})", lines)


def _nothing_found(run: Any, run_dir: str | None, own: str | None, found: _Found) -> str:
    """What ``auto`` looked at when it found nothing to resume."""
    where = own if own is not None else "the checkpoint directory"
    beside = (
        f" or in earlier runs of this experiment beside {run_dir}"
        if run.trainer.checkpoint_dir is None and run_dir is not None
        else ""
    )
    note = f"trainer.resume=auto: no checkpoint in {where}{beside}; starting at step 0"
    if found.others:
        listed = "; ".join(f"{p} ({', '.join(d[:2]) or 'unreadable'})" for p, d in found.others[:3])
        more = f" and {len(found.others) - 3} more" if len(found.others) > 3 else ""
        note += (
            f". Checkpoints of other experiments were not resumed: {listed}{more} (give "
            f"trainer.resume=<path> to continue one of them anyway)"
        )
    return note


def _check_experiment(run: Any, path: str, own: str) -> None:
    """Refuse to continue another experiment's checkpoint found by ``auto`` in the run's own
    checkpoint directory (a ``trainer.checkpoint_dir`` shared between experiments)."""
    recorded = _recorded(path)[0]
    if recorded is None:
        return
    diffs = differences(recorded, experiment_identity(run) or {})
    if diffs:
        raise ConfigError(
            f"trainer.resume=auto found {path!r} in {own}, written by another experiment ("
            + "; ".join(diffs[:4])
            + (f"; {len(diffs) - 4} more" if len(diffs) > 4 else "")
            + "): give this experiment its own trainer.checkpoint_dir, continue that "
            f"checkpoint on purpose with trainer.resume={path}, or set trainer.resume=null"
        )


def _check_steps(run: Any, path: str, what: str) -> None:
    """Refuse a checkpoint that leaves no step to train (nothing would run after Ray starts)."""
    step = int(read_state(path).get("step", 0))
    total = run.trainer.total_steps
    if step >= total:
        raise ConfigError(
            f"{what} is at step {step}, and trainer.total_steps={total}: nothing is left to "
            f"train. Raise trainer.total_steps above {step} to train on (e.g. "
            f"trainer.total_steps={step + total}), or set trainer.resume=null to start afresh"
        )


def _check_later_checkpoints(run: Any, run_dir: str | None, path: str) -> None:
    """Refuse ``trainer.resume=<path>`` into a checkpoint directory that holds checkpoints past
    the resumed step (another run's, or this run's own beyond the step rewound to): training
    on would replace them step by step and prune the rest."""
    from rltrain.config.files import checkpoint_dir_contents

    own = checkpoint_root(run, run_dir) if run_dir is not None else run.trainer.checkpoint_dir
    if own is None or "://" in own or not os.path.isdir(own):
        return
    step = int(read_state(path).get("step", 0))
    later = [n for n in checkpoint_dir_contents(own)[1] if int(n.removeprefix("step-")) > step]
    if later:
        key = "trainer.checkpoint_dir" if run.trainer.checkpoint_dir else "hydra.run.dir"
        raise ConfigError(
            f"trainer.resume={run.trainer.resume!r} continues from step {step}, but this run's "
            f"checkpoint directory {own!r} holds later checkpoints ({', '.join(later[-3:])}): "
            f"training on would replace them and prune the rest. Point {key} at a new "
            f"directory, or move them away first"
        )


def _check_model(run: Any, path: str, what: str) -> None:
    """Refuse a reasoning checkpoint written for another model (embodied runs check on load)."""
    if run.runner != "reasoning":
        return
    recorded = read_state(path).get("model")
    if recorded is not None and recorded != model_fingerprint(run):
        raise ConfigError(
            f"{what} {path!r}, written for model {recorded}, but model.* is "
            f"{model_fingerprint(run)}: resume with the model settings it was written with, or "
            f"set trainer.resume=null to start fresh"
        )


def resume_state(ckpt: CheckpointManager, run: Any, fingerprint: str, same: str, load: Any) -> int:
    """The loop's resume hook, shared by the runners: find ``trainer.resume``'s checkpoint,
    refuse one written for another model, and have the workers load it.

    Args:
        ckpt: the run's checkpoint manager.
        run: the run config (``trainer.resume``).
        fingerprint: this run's model fingerprint (what the checkpoint must record).
        same: the keys that must match, for the refusal's fix (e.g. ``model settings``).
        load: ``load(path)``: the workers load the checkpoint (inside their lease).

    Returns:
        The update to start from (0 without a checkpoint to resume).

    Raises:
        ConfigError: the checkpoint was written for another model.
    """
    path = ckpt.resolve(run.trainer.resume)
    if path is None:
        return 0
    state = read_state(path)
    if state.get("model") != fingerprint:
        raise ConfigError(
            f"trainer.resume={path!r} was written for {state.get('model')} but this run is "
            f"{fingerprint}: resume with the same {same}"
        )
    load(f"{path}")
    return int(state["step"])


def save_state(ckpt: CheckpointManager, run: Any, step: int, fingerprint: str, write: Any) -> str:
    """The loop's save hook, shared by the runners: the workers write into a pending
    checkpoint (``write(path)``, inside their lease), which is committed with the run's record.

    Returns:
        The committed checkpoint's path.

    Raises:
        ResourceError: the checkpoint directory cannot be written: a worker's write ran out of
            space (the worker's error, which a restart would only meet again), or the commit
            failed.
    """
    pending = ckpt.begin(step)
    try:
        write(pending.path)
    except WorkerError as exc:
        inner = worker_cause(exc)
        if isinstance(inner, ResourceError):
            raise ResourceError(f"{inner} ({exc.where or 'a worker'})") from exc
        raise
    return ckpt.commit(pending, {"model": fingerprint, **training_record(run)})
