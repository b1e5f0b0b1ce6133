"""What the model-holding workers share: device choice, residency and the memory ledger.

Each worker owns its state. ``offload(kinds)`` / ``reload(kinds)`` move it through a
:class:`~rltrain.backends.offload.StateMover`; ``memory_report()`` tells the driver's residency
coordinator what the worker holds, checked against an independent walk of every tensor the
worker object reaches (so a tensor kept outside the declared state is caught).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from rltrain.backends.host_allreduce import HostAllReduce
from rltrain.backends.offload import StateMover
from rltrain.errors import ResourceError, WorkerError, exception_chain
from rltrain.scheduler import Worker
from rltrain.telemetry import trace

#: Bytes the independent measure may exceed the ledger by before it is an error (allocator
#: rounding, tiny buffers such as rotary caches that belong to no declared kind).
LEDGER_TOLERANCE_BYTES = 256 * 1024


#: Set by the runtime in every worker: the accelerator type of its node (``cuda``, ``sim``, ...).
ACCELERATOR_ENV = "RLTRAIN_ACCELERATOR"


def cuda_device_to_select(devices: tuple[int, ...]) -> int | None:
    """The CUDA device a process must make current to compute on its own first device.

    A process that does not isolate its accelerators sees every GPU the job reserved on its
    node, and unindexed CUDA calls (``torch.cuda.current_device()``, NCCL groups, a bare
    ``synchronize()``) go to the current device, which starts as 0 in every process.

    Args:
        devices: the worker's devices, as positions in its ``CUDA_VISIBLE_DEVICES``.

    Returns:
        The position to pass to ``torch.cuda.set_device``, or None when there is nothing to
        change: no devices, or the first is 0 already (left unset so that CUDA is not
        initialized before first use: a vLLM engine built next decides from that whether it may
        fork its workers).
    """
    if not devices or devices[0] == 0:
        return None
    return devices[0]


def compute_device(worker: Worker) -> torch.device:
    """The torch device a worker computes on: its first GPU, or the CPU on simulated devices.

    On a GPU that device is also made the process's current CUDA device
    (:func:`cuda_device_to_select`).

    Raises:
        ResourceError: the worker was placed on real CUDA devices but torch cannot use CUDA in
            its process (a CPU build of torch, a driver too old for it): computing on the CPU
            instead would look like a very slow GPU run.
    """
    if not worker.devices:
        return torch.device("cpu")
    if torch.cuda.is_available():
        index = cuda_device_to_select(worker.devices)
        if index is not None:
            torch.cuda.set_device(index)
        return torch.device("cuda", worker.devices[0])
    if os.environ.get(ACCELERATOR_ENV) == "cuda":
        try:
            torch.cuda.init()
            cause = "no CUDA device is visible"
        except Exception as exc:  # noqa: BLE001 - torch raises several types for one cause
            cause = f"{type(exc).__name__}: {exc}"
        raise ResourceError(
            f"{type(worker).__name__} rank {worker.rank} was placed on CUDA device(s) "
            f"{list(worker.devices)} (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}) but torch cannot use CUDA in its "
            f"process ({cause}): install a CUDA build of torch matching the driver on every node"
        )
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


#: A checkpoint's folder of per-process random-number-generator states (:func:`save_rng_state`).
RNG_DIR = "rng"


def save_rng_state(directory: str, name: str, device: torch.device) -> None:
    """Write this process's global random states into ``directory/rng/<name>.pt``.

    What draws from them in training (dropout: LoRA's adapter dropout, a model's own) must draw
    the same after a resume as it would have without the interruption; the process's
    :func:`seed_everything` at start cannot give that, so a checkpoint keeps the states.

    Args:
        directory: the checkpoint directory (local).
        name: the process's file name, unique among the checkpoint's writers
            (``actor_rank1``).
        device: the process's compute device; a CUDA device's generator is saved too.
    """
    import random

    import numpy as np

    state = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    os.makedirs(os.path.join(directory, RNG_DIR), exist_ok=True)
    torch.save(state, os.path.join(directory, RNG_DIR, f"{name}.pt"))


def load_rng_state(directory: str, name: str, device: torch.device) -> bool:
    """Restore the random states :func:`save_rng_state` wrote under ``name``.

    Args:
        directory: the checkpoint directory (local).
        name: the file name the process saved under.
        device: the process's compute device (its CUDA generator is restored when saved).

    Returns:
        Whether the checkpoint held them; without them (a checkpoint of another layout, with
        more ranks than it saved) the states stay those :func:`seed_everything` set.
    """
    import random

    import numpy as np

    file = os.path.join(directory, RNG_DIR, f"{name}.pt")
    if not os.path.isfile(file):
        return False
    state = torch.load(file, weights_only=False)  # Python's and NumPy's states are tuples
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    return True


def as_rollout_logprobs(batch: Any) -> Any:
    """A generated batch with the engine's log-probs as ``rollout_logprobs``.

    The generation engines record the sampled tokens' log-probs in ``old_logprobs``; what the
    actor takes as pi_old is ``algorithm.old_logprobs``'s choice, so the rollout's numbers are
    handed on under their own name and ``old_logprobs`` stays empty.
    """
    if batch.old_logprobs is None:
        return batch
    return batch.replace(rollout_logprobs=batch.old_logprobs, old_logprobs=None)


class HostBuffers(dict[Any, Any]):
    """A worker's host-side data kept between calls, by key (the rollout's paused, ended and
    carried rows: CPU batches on every device kind).

    The ledger's walk (:func:`reachable_device_bytes`) treats it as host memory on simulated
    devices, where host and device tensors are both CPU tensors and only the declaration tells
    them apart; on a real device it still looks inside, so a CUDA tensor kept there is caught.
    """


def _walk(obj: Any, seen: set[int], out: dict[int, int], device: torch.device) -> None:
    """Add the device storages reachable from ``obj`` to ``out`` (storage ptr -> bytes)."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, HostBuffers) and device.type == "cpu":
        return  # simulated devices: its CPU tensors are host memory, not the device's
    if isinstance(obj, torch.Tensor):
        if obj.device.type == device.type and obj.untyped_storage().nbytes():
            out[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
        if obj.grad is not None:
            _walk(obj.grad, seen, out, device)
        return
    if isinstance(obj, (StateMover, HostAllReduce)):
        return  # their buffers are host memory by definition (a mover's, a shared file)
    if isinstance(obj, torch.nn.Module):
        for t in (*obj.parameters(), *obj.buffers()):
            _walk(t, seen, out, device)
        items: Iterable[Any] = vars(obj).values()
    elif isinstance(obj, torch.optim.Optimizer):
        items = list(obj.state.values())
    elif isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple, set)):
        items = obj
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("rltrain"):
        items = vars(obj).values()
    else:
        return
    for v in items:
        _walk(v, seen, out, device)


def reachable_device_bytes(obj: Any, device: torch.device) -> int:
    """Bytes of distinct device storages reachable from a worker object (the independent measure).

    On GPUs "device" means CUDA tensors; on simulated devices every CPU tensor the worker keeps
    outside a state mover's host buffers and its :class:`HostBuffers` counts as device-resident.
    """
    out: dict[int, int] = {}
    _walk(obj, set(), out, device)
    return sum(out.values())


#: The ends of an update's allocator peak metrics (:func:`memory_peaks`); ranks report their max.
PEAK_METRICS = ("memory_allocated_peak_gib", "memory_reserved_peak_gib")
#: An actor rank's trained tokens in its update (``token_mask``'s sum: infra-failed rows and
#: tool results count none); it weighs the rank's per-token metrics over the ranks.
LOSS_TOKENS = "actor/loss_tokens"


def memory_peaks(
    device: torch.device, component: str = "actor", reset: bool = False
) -> dict[str, float]:
    """The CUDA caching allocator's peaks on ``device`` since the last reset, in GiB.

    ``allocated`` is what live tensors held at most; ``reserved`` what the allocator held
    from the driver at most (cached blocks included): the gap between them is memory no
    tensor used but no other process could have, what a plan of live tensors cannot predict.

    Args:
        device: the worker's compute device; other devices than CUDA report nothing.
        component: the metrics' prefix (``actor/memory_allocated_peak_gib``, ...).
        reset: start a new window (the peaks then read what follows).

    Returns:
        ``<component>/<PEAK_METRICS>`` with their values, or an empty dict off CUDA (or on
        reset).
    """
    if device.type != "cuda":
        return {}
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
        return {}
    allocated, reserved = (
        torch.cuda.max_memory_allocated(device),
        torch.cuda.max_memory_reserved(device),
    )
    names = (f"{component}/{m}" for m in PEAK_METRICS)
    return dict(zip(names, (allocated / 2**30, reserved / 2**30), strict=True))


@dataclass(frozen=True)
class TrainResult:
    """A rank's answer to an update.

    Attributes:
        metrics: the update's metrics (``actor/pg_loss``, ``critic/value_loss``, ...).
        state_bytes: the rank's full state per kind, for the memory ledger (an optimizer's
            state appears at its first step).
    """

    metrics: dict[str, float]
    state_bytes: dict[str, int]


class ResidentState:
    """Mix-in for workers that hold a model (and maybe an optimizer) on their devices."""

    mover: StateMover
    device: torch.device

    def offload(self, kinds: list[str]) -> int:
        """Move the given state kinds off the device; returns the bytes moved."""
        with trace.span("offload", self.group_name, self.device_labels):
            return self.mover.offload([k for k in kinds if k != "kv_cache"])

    def reload(self, kinds: list[str]) -> int:
        """Bring the given state kinds back; returns the bytes moved."""
        with trace.span("reload", self.group_name, self.device_labels):
            return self.mover.reload([k for k in kinds if k != "kv_cache"])

    def transient_bytes(self) -> dict[str, int]:
        """Device bytes the worker holds now beside its mover's state, by kind (the actor's
        IPC buckets between an export and its receivers' loads); declared in the ledger
        check, planned as the stage's transient terms. None by default."""
        return {}

    def state_bytes(self) -> dict[str, int]:
        """Bytes per state kind when fully resident (the ledger's ``total``)."""
        resident = self.mover.resident_bytes()
        host = self.mover.host_bytes()
        return {k: resident.get(k, 0) or host.get(k, 0) for k in resident}

    def memory_report(self) -> dict[str, Any]:
        """Ledger bytes vs the independent measure; raises when the worker holds undeclared state.

        Raises:
            WorkerError: the walk finds more device bytes than the declared state.
        """
        transient = self.transient_bytes()
        declared = sum(self.mover.resident_bytes().values()) + sum(transient.values())
        measured = reachable_device_bytes(self, self.device)
        if measured > declared + LEDGER_TOLERANCE_BYTES:
            name = f"{os.environ.get('RLTRAIN_GROUP', type(self).__name__)} rank {self.rank}"
            raise WorkerError(
                f"{name} holds {measured - declared} bytes on its device that its memory ledger "
                f"does not declare (declared {declared}, found {measured}): keep device tensors "
                f"in the model/optimizer state or free them after the stage"
            )
        return {
            "declared": declared,
            "measured": measured,
            "offloaded": sorted(self.mover.offloaded),
            "transient": transient,
        }

    def memory_report_beside(self, engine: Any, what: str, why: str) -> dict[str, Any]:
        """Like :meth:`memory_report` where the walk cannot measure ``engine`` itself.

        The engine's bytes are taken from its own ledger; the walk checks everything the worker
        holds outside it.

        Args:
            engine: the attribute the walk skips.
            what: the engine in messages ("training engine").
            why: why its ledger is trusted, for the report.

        Raises:
            WorkerError: the worker holds device bytes outside the engine its ledger does not
                declare.
        """
        transient = self.transient_bytes()
        beside = sum(transient.values())  # declared, and held outside the engine
        declared = sum(self.mover.resident_bytes().values()) + beside
        others = {k: v for k, v in vars(self).items() if v is not engine}
        outside = reachable_device_bytes(others, self.device)
        if outside > beside + LEDGER_TOLERANCE_BYTES:
            name = f"{os.environ.get('RLTRAIN_GROUP', type(self).__name__)} rank {self.rank}"
            raise WorkerError(
                f"{name} holds {outside - beside} bytes on its device outside its {what} that "
                f"its memory ledger does not declare: keep device tensors in the engine's state "
                f"or free them after the stage"
            )
        return {
            "declared": declared,
            "measured": declared - beside + outside,
            "offloaded": sorted(self.mover.offloaded),
            "transient": transient,
            "engine_bytes": f"declared ({why})",
        }


def fetch(items: Iterable[Any]) -> list[Any]:
    """The values behind a list of object refs; values given directly pass through.

    Workers take rollout shards either as refs (fetched here, in the worker, not by the driver)
    or as values (Ray resolves refs passed as top-level call arguments; unit tests pass values).
    """
    import ray

    items = list(items)
    where = [i for i, x in enumerate(items) if isinstance(x, ray.ObjectRef)]
    if not where:
        return items
    for i, value in zip(where, ray.get([items[i] for i in where]), strict=True):
        items[i] = value
    return items


#: Errors of a write that found its filesystem full (ENOSPC) or over quota (EDQUOT).
_NO_ROOM_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: What torch's zip writer (``torch.save``) raises when a write fails, without the errno:
#: ``[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598``,
#: ``PytorchStreamWriter failed writing file data/0: file write failed``, or its file stream's
#: own ``basic_ios::clear: iostream error`` (a small file, failing as it is flushed).
_TORCH_WRITE_FAILED = (
    "inline_container",
    "unexpected pos",
    "PytorchStreamWriter failed writing",
    "basic_ios::clear",
)
#: Free bytes under which torch's failed write is taken for one that ran out of space: a
#: writer that fills the disk leaves it at (nearly) 0 free.
NO_ROOM_BYTES = 16 << 20


def out_of_space(exc: BaseException, directory: str) -> int | None:
    """Whether ``exc``, raised while writing into ``directory``, means its filesystem is full:
    ``ENOSPC`` or ``EDQUOT`` (or "No space left on device") anywhere in its chain, or torch's
    zip writer failing without an errno while under :data:`NO_ROOM_BYTES` are free there. Any
    other error is not, however little room is left (a CUDA or NCCL error during a gather).

    Args:
        exc: what the write raised.
        directory: where it wrote (a local path, measured as it is now: call this before
            removing what the write left).

    Returns:
        The bytes free there when the write ran out of space (0 when unknown), else None.
    """
    free = _free_bytes(directory)
    torch_write_failed = False
    for e in exception_chain(exc):
        if isinstance(e, OSError) and e.errno in _NO_ROOM_ERRNOS:
            return free or 0
        text = str(e)
        if "No space left on device" in text:
            return free or 0
        torch_write_failed |= any(mark in text for mark in _TORCH_WRITE_FAILED)
    if torch_write_failed and free is not None and free < NO_ROOM_BYTES:
        return free
    return None


def _free_bytes(directory: str) -> int | None:
    """Bytes free to this user on the filesystem of ``directory`` (or its nearest existing
    parent); None when it cannot be read."""
    import shutil

    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


class local_dir:
    """A local directory to write into; uploaded to ``path`` on exit when it is a remote URI.

    A write into it that runs out of space (:func:`out_of_space`) is raised as a
    :class:`~rltrain.errors.ResourceError` naming the directory and the fix.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.remote = "://" in path and not path.startswith("file://")

    def __enter__(self) -> str:
        if not self.remote:
            os.makedirs(self.path, exist_ok=True)
            return self.path
        import tempfile

        self._tmp = tempfile.TemporaryDirectory()
        return self._tmp.name

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        local = self._tmp.name if self.remote else self.path
        free = None
        try:
            if isinstance(exc, Exception):
                # measured while the partial files still fill the filesystem
                free = out_of_space(exc, local)
            if self.remote and exc is None:
                import fsspec

                fs, root = fsspec.core.url_to_fs(self.path)
                fs.put(self._tmp.name + "/", root, recursive=True)
        finally:
            if self.remote:
                self._tmp.cleanup()
        if free is not None:
            raise ResourceError(self._full(local, free, exc)) from exc

    def _full(self, local: str, free: int, exc: BaseException | None) -> str:
        """The message of a write into ``local`` that ran out of space."""
        error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]}"
        if not self.remote:
            return (
                f"cannot write the checkpoint into {local}: its filesystem is full ({free} "
                f"bytes free; {error}): free space there, or point trainer.checkpoint_dir at "
                f"storage with room; the previous checkpoint is intact"
            )
        tmp = os.path.dirname(local)
        return (
            f"cannot write the checkpoint for {self.path}: the local temporary directory it is "
            f"written into before the upload ({tmp}: TMPDIR, else /tmp) is on a full filesystem "
            f"({free} bytes free; {error}): free space in {tmp}, or set TMPDIR to a local "
            f"directory with room for one checkpoint; the previous checkpoint is intact"
        )


class fetched_dir(local_dir):
    """A local copy of ``path`` (downloaded first when it is a remote URI)."""

    def __enter__(self) -> str:
        local = super().__enter__()
        if self.remote:
            import fsspec

            fs, root = fsspec.core.url_to_fs(self.path)
            fs.get(root + "/", local, recursive=True)
        return local

    def __exit__(self, *exc: object) -> None:
        if self.remote:
            self._tmp.cleanup()


class WeightReceiver:
    """Mix-in for workers that take the actor's weight versions (rollout, inference).

    The worker keeps its model in ``self.engine`` (a generation engine or a
    :class:`~rltrain.backends.generation.TorchReceiver`), holds ``self.version`` (``-1`` until
    the first version arrives) and learns its transport from the runner
    (:meth:`setup_weight_sync`); :meth:`_sync` then loads what the driver hands it.
    """

    engine: Any
    version: int = -1
    _feeders: tuple[int, ...] = (0,)

    def setup_weight_sync(self, choice: Any) -> int:
        """Learn the transport chosen for this component (a ``TransportChoice``).

        Returns:
            The processes this worker puts in a broadcast group (its engine's TP workers).
        """
        self._feeders = choice.feeder_ranks(self.rank) or (0,)
        return int(self.engine.sync_members)

    def join_weight_sync(
        self, backend: str, host: str, port: int, world: int, first: int, timeout_s: float
    ) -> None:
        """(collective) Join the broadcast group of this worker's source actor rank."""
        self.engine.join_sync(backend, host, port, world, first, timeout_s)

    def catch_up(self, weights: Any) -> int:
        """Take the weights handed over (all versions up to theirs, under ``collective``).

        Returns:
            The version held afterwards.
        """
        self._sync(weights, None)
        return self.version

    def _sync(self, weights: Any, expect: int | None) -> None:
        from rltrain.backends.weight_sync.transport import (
            CollectiveVersion,
            acknowledge_ipc,
            payload_for,
            weight_version,
        )

        if weights is not None:
            target = weight_version(weights)
            if isinstance(weights, CollectiveVersion):
                if target > self.version:
                    with trace.span("sync", self.group_name, self.device_labels):
                        self.version = self.engine.receive(self.version, target)
            elif target != self.version:
                with trace.span("sync", self.group_name, self.device_labels):
                    self.engine.load(payload_for(weights, self._feeders))
                    # IPC: the actor frees its buckets now, before this worker allocates more
                    timeout = self.run.cluster.collective_timeout_s  # type: ignore[attr-defined]
                    acknowledge_ipc(weights, self._feeders, self.rank, timeout)
                self.version = target
        if expect is not None and self.version < expect:
            raise WorkerError(
                f"{self.group_name} rank {self.rank} holds weight version {self.version} but the "
                f"step needs {expect}: the actor's weights were not sent"
            )
