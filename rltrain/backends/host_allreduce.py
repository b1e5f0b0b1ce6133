"""Gradient averaging through shared memory for data-parallel CPU ranks on one host.

On simulated devices every data-parallel rank is a CPU process on the same machine, and the
gradient all-reduce went through gloo: on the 2-core development machine a gloo all-reduce of
the tiny policy's 0.3 MiB of gradients takes ~2.4 ms, and ~1.7 ms for 4 KiB (the cost is
thread and process wake-ups, not bytes), on top of waiting for the slowest rank. Here the ranks
instead write their gradients into one shared-memory file and each sums the rows itself:

- :meth:`HostAllReduce.connect` (collective, every rank of the process group): rank 0 makes a
  file in ``/dev/shm`` and every rank maps it; the file is unlinked as soon as every rank has
  it mapped, so nothing is left behind when a process dies (a maker killed before that, its
  pid in the file's name, has its file removed by the next maker). When any rank cannot map
  it (ranks on several hosts, separate ``/dev/shm`` namespaces, a CPU without x86's store
  ordering), every rank gets ``None`` and gloo stays in use.
- :meth:`HostAllReduce.mean_` averages a tensor in place: write my row, raise my arrival
  counter, wait until every counter has arrived, sum the rows in rank order (so every rank gets
  bit-identical results and the replicas stay equal), divide by the world size. Two regions
  alternate, so a rank may start the next round while a slower one still reads the last.
- :func:`mean_hook` is the DistributedDataParallel communication hook that calls it, and
  :func:`wrap_data_parallel` builds the DDP wrapper every torch trainer here uses.
- :func:`sum_over_ranks` / :func:`data_parallel_ranks`: the one small collective an update
  makes before its first step (each minibatch's token count summed over the ranks, so a
  token-mean loss weighs every rank's tokens alike), through the process group itself.

Arrival is a per-rank counter, spun on (``sched_yield``) for a few ms and then polled; a rank
that does not arrive within ``cluster.collective_timeout_s`` raises, naming it. The counters
rely on x86-64's total store order (a rank's row is visible before its counter): other CPUs keep
gloo. DeepSpeed's CPU backend has a shared-memory all-reduce for the same reason.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import mmap
import os
import platform
import tempfile
import threading
import time
from typing import Any

import torch

from rltrain.algorithms.update import Ranks
from rltrain.errors import WorkerError

#: Bytes of one rank's row in a region; larger tensors are averaged in chunks of this size.
CHUNK_BYTES = 4 << 20
#: Where the file is made (a RAM file system on Linux).
SHM_DIR = "/dev/shm"
#: Wait rounds spent spinning (~5 ms) before polling with sleeps.
_SPIN_ROUNDS = 2000
_POLL_S = 2e-4
_LINE = 64  # one cache line per arrival counter, so ranks do not write the same line


def _usable_here(directory: str) -> bool:
    return (
        platform.system() == "Linux"
        and platform.machine().lower() in ("x86_64", "amd64")
        and os.path.isdir(directory)
        and os.access(directory, os.W_OK)
    )


class HostAllReduce:
    """Average tensors across the ranks of a process group through one shared-memory file.

    Built by :meth:`connect`, not directly.

    Args:
        buffer: the mapped file (``mmap``), kept open for the object's life.
        rank: this process's rank.
        world_size: ranks in the group.
        capacity: bytes of one rank's row in a region.
        timeout_s: how long a rank waits for the others before raising.
    """

    def __init__(
        self, buffer: mmap.mmap, rank: int, world_size: int, capacity: int, timeout_s: float
    ) -> None:
        self.rank, self.world_size, self.capacity = rank, world_size, capacity
        self.timeout_s = timeout_s
        self._buffer = buffer
        raw = torch.frombuffer(buffer, dtype=torch.uint8)
        header = _LINE * (world_size + 1)  # line 0: the token; then one line per rank
        self._arrived = raw[_LINE:header].view(torch.int64)[:: _LINE // 8]
        region = world_size * capacity
        self._regions = [
            raw[header + i * region : header + (i + 1) * region].view(world_size, capacity)
            for i in range(2)
        ]
        self._round = 0  # the file starts zeroed: no rank has arrived anywhere
        self._fence = threading.Lock()  # a locked instruction: orders the row before the counter

    @staticmethod
    def file_bytes(world_size: int, capacity: int) -> int:
        """Size of the shared file for ``world_size`` ranks and ``capacity``-byte rows."""
        return _LINE * (world_size + 1) + 2 * world_size * capacity

    @classmethod
    def connect(
        cls,
        max_bytes: int,
        timeout_s: float,
        group: Any = None,
        directory: str = SHM_DIR,
    ) -> HostAllReduce | None:
        """Map one shared file in every rank of ``group`` (collective: every rank calls it).

        Args:
            max_bytes: the largest tensor to average (rows are at most :data:`CHUNK_BYTES`).
            timeout_s: how long :meth:`mean_` waits for the other ranks.
            group: the torch.distributed process group (None: the default one).
            directory: where rank 0 makes the file (``/dev/shm``).

        Returns:
            The all-reduce on every rank, or ``None`` on every rank when any rank cannot map
            the file (they then keep the process group's own all-reduce).
        """
        import torch.distributed as dist

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        usable = [False] * world
        dist.all_gather_object(usable, _usable_here(directory), group=group)
        if world < 2 or not all(usable):
            return None
        capacity = max(_LINE, -(-min(max_bytes, CHUNK_BYTES) // _LINE) * _LINE)
        size = cls.file_bytes(world, capacity)
        shared: list[Any] = [None, None]
        if rank == 0:
            shared = _make_file(directory, size)
        try:
            src = 0 if group is None else dist.get_global_rank(group, 0)
            dist.broadcast_object_list(shared, src=src, group=group)
            path, token = shared
            buffer = _map(path, size, token) if path is not None else None
            mapped = [False] * world
            dist.all_gather_object(mapped, buffer is not None, group=group)
        finally:
            if rank == 0 and shared[0] is not None:
                # every rank has mapped it, given up, or failed: nothing to leave behind
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(shared[0])
        if not all(mapped):
            if buffer is not None:
                buffer.close()
            return None
        return cls(buffer, rank, world, capacity, timeout_s)

    def mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Replace ``tensor`` by its mean over the ranks (every rank calls it, same shapes).

        Args:
            tensor: a contiguous CPU tensor.

        Returns:
            ``tensor``, now holding the mean (identical on every rank).

        Raises:
            WorkerError: a rank did not arrive within ``timeout_s``.
        """
        flat = tensor.view(-1)
        per_round = self.capacity // tensor.element_size()
        acc = torch.float32 if tensor.element_size() < 4 else tensor.dtype
        for start in range(0, flat.numel(), per_round):
            part = flat[start : start + per_round]
            self._round += 1
            region = self._regions[self._round % 2]
            rows = region[:, : part.numel() * tensor.element_size()].view(tensor.dtype)
            rows[self.rank].copy_(part)
            with self._fence:
                pass
            self._arrived[self.rank] = self._round
            self._wait(self._round)
            part.copy_(rows.sum(dim=0, dtype=acc).div_(self.world_size))
        return tensor

    def _wait(self, round_: int) -> None:
        arrived = self._arrived
        for _ in range(_SPIN_ROUNDS):
            if int(arrived.min()) >= round_:
                return
            os.sched_yield()
        deadline = time.monotonic() + self.timeout_s
        while int(arrived.min()) < round_:
            if time.monotonic() > deadline:
                late = [r for r in range(self.world_size) if int(arrived[r]) < round_]
                raise WorkerError(
                    f"host all-reduce: rank(s) {late} of {self.world_size} did not arrive within "
                    f"cluster.collective_timeout_s={self.timeout_s:g} s (a peer process died or "
                    f"is stuck); raise the timeout for slow steps, or set "
                    f"cluster.host_allreduce=false to use gloo"
                )
            time.sleep(_POLL_S)


_PREFIX = "rltrain-allreduce-"


def _sweep_stale(directory: str) -> None:
    """Remove the files of makers that died between making and unlinking them (a process
    killed in that window cannot clean up): each file's name carries its maker's pid."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if not name.startswith(_PREFIX) or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
        except OSError:
            pass  # alive under another user: theirs


def _make_file(directory: str, size: int) -> list[Any]:
    """(rank 0) ``[path, token]`` of a new zeroed file of ``size`` bytes; ``[None, None]`` when
    it cannot be made (then no rank uses shared memory)."""
    _sweep_stale(directory)
    try:
        fd, path = tempfile.mkstemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=directory)
    except OSError:
        return [None, None]
    try:
        os.ftruncate(fd, size)
        token = os.urandom(16)
        os.pwrite(fd, token, 0)
    except OSError:
        os.unlink(path)
        return [None, None]
    finally:
        os.close(fd)
    return [path, token]


def _map(path: str, size: int, token: bytes) -> mmap.mmap | None:
    """The file mapped shared, or None when it is not there or not the one rank 0 made."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != size or os.pread(fd, len(token), 0) != token:
            return None
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def mean_hook(state, bucket):  # unannotated: DDP rejects the string annotations of this module
    """DistributedDataParallel communication hook: the bucket's gradients averaged in place.

    Args:
        state: the :class:`HostAllReduce`.
        bucket: DDP's ``GradBucket``.

    Returns:
        A completed ``torch.futures.Future`` holding the averaged flat gradients.
    """
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(state.mean_(bucket.buffer()))
    return fut


def _has_running_stats(model: torch.nn.Module) -> bool:
    return any(
        isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats
        for m in model.modules()
    )


def wrap_data_parallel(
    model: torch.nn.Module,
    device: torch.device,
    timeout_s: float,
    host_allreduce: bool = True,
) -> torch.nn.Module:
    """The DistributedDataParallel wrapper of ``model`` over the default process group.

    Buffers are broadcast from rank 0 at every forward only when the model keeps running
    statistics (batch norm): an LLM's buffers (rotary frequencies) are constants, identical
    from the build, and DDP's broadcast would add one collective, so one more wait for the
    slowest rank, to every forward. On CPU ranks of one host, gradients are averaged through
    :class:`HostAllReduce` when ``host_allreduce`` (``cluster.host_allreduce``).

    DDP keeps flat gradient buckets the size of every trained parameter for the wrapper's life;
    the gradients are views of them from the wrap on (``gradient_as_bucket_view``; each trained
    parameter gets a zero gradient first, which DDP adopts), so the buckets are the ``grads``
    a state mover moves and the ledger counts, not a copy left on the device by an offload.

    Args:
        model: the model, on ``device``.
        device: this rank's compute device.
        timeout_s: ``cluster.collective_timeout_s``.
        host_allreduce: try the shared-memory all-reduce on CPU.

    Returns:
        The DDP module (call it for forward passes; ``.module`` is ``model``).
    """
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    # Newer torch renames the per-forward switch (the init-time sync stays on either way).
    known = inspect.signature(DistributedDataParallel.__init__).parameters
    sync = "forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers"
    # Only trained parameters have gradients to average (LoRA: the adapters).
    trained = [p for p in model.parameters() if p.requires_grad]
    for p in trained:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    options = {sync: _has_running_stats(model), "gradient_as_bucket_view": True}
    ddp = DistributedDataParallel(model, device_ids=ids, **options)
    if device.type == "cpu" and host_allreduce:
        grad_bytes = sum(p.numel() * p.element_size() for p in trained)
        shared = HostAllReduce.connect(grad_bytes, timeout_s)
        if shared is not None:
            ddp.register_comm_hook(shared, mean_hook)
            ddp._rltrain_host_allreduce = shared  # type: ignore[attr-defined]
    return ddp


def sum_over_ranks(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``values`` summed over the default process group's ranks (the data-parallel group the
    trainers here wrap with DDP or DeepSpeed): a collective, called by every rank in the same
    order. Crosses as float64 (exact for token counts), on ``device`` under NCCL.

    Args:
        values: a small tensor.
        device: this rank's compute device (NCCL reduces device tensors only).

    Returns:
        The sums, float64, on the host.
    """
    dist = torch.distributed
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    out = values.to(on, torch.float64)
    dist.all_reduce(out)
    return out.cpu()


def data_parallel_ranks(device: torch.device) -> Ranks | None:
    """The data-parallel ranks of this process's default process group for an update
    (:class:`~rltrain.algorithms.update.Ranks`), or None when there is one rank or no group."""
    dist = torch.distributed
    if not dist.is_initialized() or dist.get_world_size() <= 1:
        return None
    return Ranks(dist.get_world_size(), functools.partial(sum_over_ranks, device=device))
