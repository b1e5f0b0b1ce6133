"""Move a torch module's and optimizer's state off its device and back, bit for bit.

:class:`StateMover` is the primitive the residency coordinator builds on: it offloads the
selected state kinds (``weights``, ``grads``, ``optimizer``) of one model + optimizer into host
buffers, releases the device storage, and later restores it. The same tensor objects
(``nn.Parameter``, ``p.grad``, the optimizer's state tensors) are kept throughout: only their
``.data`` is swapped, so the optimizer, hooks and anything else holding references keep working.
Gradients keep their storage too, emptied in place (:data:`IN_PLACE_KINDS`), since DDP's
reducer holds the buckets they are views of.

Work is done per *storage*, not per tensor: tensors that share a storage (tied embeddings,
views) are moved once and rebuilt as views of one new storage, so sharing survives a round trip.

On CUDA, host buffers are pinned, allocated once per kind and reused by every later offload
(pinning is expensive; copying into pinned memory is what reaches the bus's speed), copies are
asynchronous on the current stream with one synchronisation per call, and the caching
allocator is emptied so the driver sees the memory come back. On CPU ("simulated devices") the
same code runs: the device tensors are CPU tensors, offload copies them into a separate host
buffer and drops the originals, so the byte accounting is exercised exactly as on a GPU.

:func:`device_storages` is the independent measure: it walks the live tensors and adds up the
bytes of the distinct storages on the device, without using the mover's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from rltrain.config.schema import STATE_KINDS
from rltrain.errors import ConfigError

#: State kinds a torch module + optimizer hold (``kv_cache`` belongs to generation engines).
MOVABLE_KINDS: tuple[str, ...] = tuple(k for k in STATE_KINDS if k != "kv_cache")


def release_cached_blocks(device: torch.device) -> bool:
    """Hand the CUDA caching allocator's free blocks back to the driver, so that another
    process on the device can allocate them: after an offload, and after an update whose
    receiver shares the device (a collocated vLLM engine waking its weights; without it the
    actor kept its update's activations reserved through the weight sync: 72.4 GB on the
    2026-11-27 H100 lease, where the plan's sync stage counts 11 GB).

    Args:
        device: the worker's compute device.

    Returns:
        Whether blocks were released (CUDA only).
    """
    if device.type != "cuda":
        return False
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return True


# Host buffers are packed with this alignment so every storage starts on a DMA-friendly boundary
# and any dtype can be viewed at its offset.
_ALIGN = 512


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def iter_state_tensors(
    model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, kind: str
) -> Iterator[torch.Tensor]:
    """Yield the tensors of one state kind (may repeat a tensor; callers de-duplicate).

    Args:
        model: the module whose parameters and gradients are walked, or None.
        optimizer: the optimizer whose per-parameter state is walked (``optimizer`` kind).
        kind: one of :data:`MOVABLE_KINDS`.

    Returns:
        An iterator over the tensors (parameters' ``.grad`` tensors for ``grads``).
    """
    if kind == "weights" and model is not None:
        yield from model.parameters()
        yield from model.buffers()
    elif kind == "grads" and model is not None:
        for p in model.parameters():
            if p.grad is not None:
                yield p.grad
    elif kind == "optimizer" and optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    yield value


def _check_kinds(kinds: Iterable[str] | None) -> tuple[str, ...]:
    if kinds is None:
        return MOVABLE_KINDS
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in MOVABLE_KINDS]
    if bad:
        raise ConfigError(
            f"offload state kinds {bad} cannot be moved by a torch module's state mover: "
            f"choose from {list(MOVABLE_KINDS)} (kv_cache belongs to the generation engine)"
        )
    return kinds


def device_storages(
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
    device: torch.device | str | None = None,
) -> dict[str, int]:
    """Bytes of the distinct storages each state kind holds on ``device``, walked from the tensors.

    A storage shared by two kinds is counted once, under the first kind in
    :data:`MOVABLE_KINDS` order; a storage shared by many tensors (views, tied weights) is
    counted once.

    Args:
        model: the module, or None.
        optimizer: its optimizer, or None.
        device: the device to count; None means the device of the first parameter (or of the
            first optimizer state tensor without a model).

    Returns:
        ``{kind: bytes}`` for every kind in :data:`MOVABLE_KINDS`.
    """
    dev = torch.device(device) if device is not None else _first_device(model, optimizer)
    seen: set[tuple[str, int]] = set()
    out = dict.fromkeys(MOVABLE_KINDS, 0)
    for kind in MOVABLE_KINDS:
        for t in iter_state_tensors(model, optimizer, kind):
            if not _same_device(t.device, dev):
                continue
            key = _storage_key(t)
            if key in seen:
                continue
            seen.add(key)
            out[kind] += t.untyped_storage().nbytes()
    return out


def _first_device(
    model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None = None
) -> torch.device:
    for kind in MOVABLE_KINDS:
        for t in iter_state_tensors(model, optimizer, kind):
            return t.device
    return torch.device("cpu")


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    index_a = a.index if a.index is not None else torch.cuda.current_device()
    index_b = b.index if b.index is not None else torch.cuda.current_device()
    return index_a == index_b


@dataclass(frozen=True)
class _View:
    """How one tensor sat in its storage, to rebuild it as a view of the reloaded storage."""

    tensor: torch.Tensor
    offset: int  # in elements of the tensor's dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class _Moved:
    """One storage living in a host buffer: where its bytes are and who viewed it.

    ``storage`` is set for a storage emptied in place (kept, resized to 0 bytes, and refilled
    on reload) rather than replaced under its tensors.
    """

    host_offset: int
    nbytes: int
    views: tuple[_View, ...]
    storage: torch.UntypedStorage | None = None


#: Kinds whose storages are emptied in place: a gradient may be a view of a buffer another
#: object keeps (DistributedDataParallel's bucket, :func:`~rltrain.backends.host_allreduce.
#: wrap_data_parallel`); giving the gradient a new storage would neither free the bucket nor
#: keep DDP writing into the gradient.
IN_PLACE_KINDS = frozenset({"grads"})


class StateMover:
    """Offload and reload the state of one module + optimizer, keeping tensor identities.

    Example::

        mover = StateMover(model, optimizer)
        mover.offload(["optimizer", "grads"])   # device memory of those kinds is freed
        mover.reload()                          # back, bit-identical, same tensor objects

    Args:
        model: the module, or None to move only an optimizer's state (e.g. the torch optimizer
            inside a DeepSpeed ZeRO optimizer).
        optimizer: its optimizer, or None (then the ``optimizer`` kind holds nothing).
        device: the device whose tensors move; None means the first parameter's (or first
            optimizer state tensor's). Tensors elsewhere (AdamW's CPU ``step`` counters on a
            GPU run) stay where they are.
        pin_memory: pin host buffers when the device is CUDA (ignored on CPU).
        empty_cache: return freed blocks to the driver after an offload on CUDA, so the free
            memory the driver reports (and other processes) see the room.
    """

    def __init__(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        device: torch.device | str | None = None,
        pin_memory: bool = True,
        empty_cache: bool = True,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = (
            torch.device(device) if device is not None else _first_device(model, optimizer)
        )
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._pin = pin_memory and self.device.type == "cuda"
        self._empty_cache = empty_cache
        self._host: dict[str, torch.Tensor] = {}  # kind -> flat uint8 buffer, reused
        self._moved: dict[str, tuple[_Moved, ...]] = {}  # offloaded kind -> its storages

    # ----------------------------------------------------------------------------- queries
    @property
    def offloaded(self) -> frozenset[str]:
        """The kinds currently off the device."""
        return frozenset(self._moved)

    def resident_bytes(self) -> dict[str, int]:
        """Bytes each kind holds on the device now, from the storages its tensors use.

        Returns:
            ``{kind: bytes}`` for every kind in :data:`MOVABLE_KINDS`; an offloaded kind is 0.
        """
        out = device_storages(self.model, self.optimizer, self.device)
        for kind in self._moved:
            out[kind] = 0
        return out

    def offloaded_bytes(self) -> dict[str, int]:
        """Exact bytes of each offloaded kind (what :meth:`reload` will bring back)."""
        return {k: sum(m.nbytes for m in moved) for k, moved in self._moved.items()}

    def host_bytes(self) -> dict[str, int]:
        """Bytes of host buffer each kind keeps (allocated once, reused by later offloads)."""
        return {k: int(buf.numel()) for k, buf in self._host.items()}

    # ------------------------------------------------------------------------------ moves
    def offload(self, kinds: Iterable[str] | None = None) -> int:
        """Copy the given kinds to host buffers and release their device storage.

        Kinds already offloaded are skipped, so the call is idempotent.

        Args:
            kinds: state kinds to move; None means every kind in :data:`MOVABLE_KINDS`.

        Returns:
            Bytes moved to the host by this call.

        Raises:
            ConfigError: for a kind that is not in :data:`MOVABLE_KINDS`.
        """
        todo = [k for k in _check_kinds(kinds) if k not in self._moved]
        groups = self._group_storages(todo)
        moved_bytes = 0
        for kind in todo:
            self._moved[kind] = self._copy_out(kind, groups[kind])
            moved_bytes += sum(m.nbytes for m in self._moved[kind])
        self._sync()
        # Only now, with every copy finished, may the device storages go.
        placeholder: dict[torch.dtype, torch.Tensor] = {}
        for kind in todo:
            for moved in self._moved[kind]:
                if moved.storage is not None:
                    moved.storage.resize_(0)
                    continue
                for v in moved.views:
                    empty = placeholder.setdefault(
                        v.tensor.dtype, torch.empty(0, dtype=v.tensor.dtype, device=self.device)
                    )
                    v.tensor.data = empty
        if self._empty_cache and todo:
            release_cached_blocks(self.device)
        return moved_bytes

    def reload(self, kinds: Iterable[str] | None = None) -> int:
        """Restore offloaded kinds to the device, bit-identical, into the same tensor objects.

        Args:
            kinds: state kinds to bring back; None means every offloaded kind.

        Returns:
            Bytes copied back to the device by this call.

        Raises:
            ConfigError: for a kind that is not in :data:`MOVABLE_KINDS`.
        """
        todo = [k for k in _check_kinds(kinds) if k in self._moved]
        total = 0
        for kind in todo:
            host = self._host[kind]
            for moved in self._moved[kind]:
                src = host[moved.host_offset : moved.host_offset + moved.nbytes]
                if moved.storage is not None:
                    moved.storage.resize_(moved.nbytes)
                    flat = torch.empty(0, dtype=torch.uint8, device=self.device)
                    flat.set_(moved.storage).copy_(src, non_blocking=self._pin)
                    total += moved.nbytes
                    continue
                storage = torch.empty(moved.nbytes, dtype=torch.uint8, device=self.device)
                storage.copy_(src, non_blocking=self._pin)
                untyped = storage.untyped_storage()
                for v in moved.views:
                    v.tensor.data = torch.empty(0, dtype=v.tensor.dtype, device=self.device).set_(
                        untyped, v.offset, v.size, v.stride
                    )
                total += moved.nbytes
        self._sync()
        for kind in todo:
            del self._moved[kind]
        return total

    def release_host_buffers(self) -> None:
        """Free the host buffers of kinds that are resident (they are re-made on next offload)."""
        for kind in [k for k in self._host if k not in self._moved]:
            del self._host[kind]

    # ---------------------------------------------------------------------------- helpers
    def _group_storages(self, kinds: list[str]) -> dict[str, list[list[torch.Tensor]]]:
        """Tensors of each kind grouped by storage; a storage belongs to the first kind seen."""
        owner: dict[tuple[str, int], str] = {}
        members: dict[tuple[str, int], list[torch.Tensor]] = {}
        seen_tensors: set[int] = set()
        for kind in MOVABLE_KINDS:  # fixed order so shared storages get a stable owner
            for t in iter_state_tensors(self.model, self.optimizer, kind):
                if id(t) in seen_tensors or not _same_device(t.device, self.device):
                    continue
                if t.untyped_storage().nbytes() == 0:
                    continue
                seen_tensors.add(id(t))
                key = _storage_key(t)
                owner.setdefault(key, kind)
                members.setdefault(key, []).append(t)
        out: dict[str, list[list[torch.Tensor]]] = {k: [] for k in kinds}
        for key, kind in owner.items():
            if kind in out:
                out[kind].append(members[key])
        return out

    def _host_buffer(self, kind: str, nbytes: int) -> torch.Tensor:
        buf = self._host.get(kind)
        if buf is None or buf.numel() < nbytes:
            self._host.pop(kind, None)  # drop the old one before pinning a bigger one
            buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self._pin)
            self._host[kind] = buf
        return buf

    def _copy_out(self, kind: str, storages: list[list[torch.Tensor]]) -> tuple[_Moved, ...]:
        sizes = [ts[0].untyped_storage().nbytes() for ts in storages]
        host = self._host_buffer(kind, sum(_align(n) for n in sizes))
        out = []
        offset = 0
        for tensors, nbytes in zip(storages, sizes, strict=True):
            src = torch.empty(0, dtype=torch.uint8, device=self.device).set_(
                tensors[0].untyped_storage()
            )
            host[offset : offset + nbytes].copy_(src, non_blocking=self._pin)
            views = tuple(
                _View(t, t.storage_offset(), tuple(t.shape), tuple(t.stride())) for t in tensors
            )
            keep = tensors[0].untyped_storage() if kind in IN_PLACE_KINDS else None
            out.append(_Moved(host_offset=offset, nbytes=nbytes, views=views, storage=keep))
            offset += _align(nbytes)
        return tuple(out)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
