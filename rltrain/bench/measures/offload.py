"""``offload``: moving a model's training state off its device and back, against a plain memcpy.

The state is a real one: an MLP (``layers`` x ``Linear(d, d)``) after one AdamW step, so it holds
weights, gradients and two moment buffers (about 16 bytes per parameter). The backends'
:class:`~rltrain.backends.offload.StateMover` moves all of it — the primitive a collocated
placement pays between stages. The baseline is one ``copy_`` of the same number of bytes from a
flat device tensor into a reused host buffer (pinned on CUDA); the other direction is a case too,
so offload compares with device->host and reload with host->device.

On CUDA the device is the GPU and the copies cross the bus. On a machine without one the
"device" is host memory (the simulated devices' setting): the figures then show the mover's own
overhead over memcpy — per-storage bookkeeping, and on reload fresh allocations whose pages the
first copy must fault in.

Each timed call must start from the right state (resident before an offload, offloaded before a
reload) without an untimed reset in between, so the measure builds one model per timed call and
the offload case offloads them in turn, the reload case brings them back in turn. Host buffers
are allocated (and pinned) before timing by one round trip per model, as a run reuses them.
"""

from __future__ import annotations

from typing import Any

from rltrain.bench.harness import Case, Suite, counts, measure

WARMUP, REPEATS = 1, 5
#: (width, layers) of the MLP per setting: about 16 bytes of state per parameter.
SIZES = {"quick": (512, 4), "cpu": (1024, 8), "cuda": (4096, 4)}


def _calls(quick: bool) -> int:
    """Timed plus warm-up calls the harness makes per case (asked of its own rule)."""
    suite = Suite(cases=(), baseline="", warmup=WARMUP, repeats=REPEATS)
    return sum(counts(Case("any", lambda: None), suite, quick))


def build_state(width: int, layers: int, device: Any) -> tuple[Any, Any]:
    """An MLP and its AdamW optimizer after one step (weights, grads, moments all exist)."""
    import torch

    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(8, width, device=device)).square().mean().backward()
    opt.step()
    return model, opt


def _storage_bytes(model: Any, optimizer: Any) -> list[Any]:
    """Each distinct storage of the state as a flat uint8 tensor (what the mover copies)."""
    import torch

    from rltrain.backends.offload import MOVABLE_KINDS, iter_state_tensors

    seen: set[int] = set()
    out = []
    for kind in MOVABLE_KINDS:
        for t in iter_state_tensors(model, optimizer, kind):
            storage = t.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() == 0:
                continue
            seen.add(storage.data_ptr())
            out.append(torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage))
    return out


class _Pool:
    """Movers used in turn, so every timed call finds its mover in the state it needs."""

    def __init__(self, movers: list[Any], sync: Any) -> None:
        self.movers = movers
        self.sync = sync
        self.next_offload = 0
        self.next_reload = 0

    def offload(self) -> None:
        m = self.movers[self.next_offload % len(self.movers)]
        self.next_offload += 1
        if m.offloaded:  # only when the harness calls more often than planned
            m.reload()
        m.offload()
        self.sync()

    def reload(self) -> None:
        m = self.movers[self.next_reload % len(self.movers)]
        self.next_reload += 1
        if not m.offloaded:
            m.offload()
        m.reload()
        self.sync()


@measure("offload", "offload/reload a model's training state (StateMover) vs memcpy of the bytes")
def offload(quick: bool) -> Suite:
    import torch

    from rltrain.backends.offload import StateMover, device_storages

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    width, layers = SIZES["quick" if quick else ("cuda" if on_gpu else "cpu")]

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    states = [build_state(width, layers, device) for _ in range(_calls(quick))]
    movers = [StateMover(model, opt, device=device) for model, opt in states]
    nbytes = sum(device_storages(*states[0], device).values())
    for m in movers:  # allocate (and pin) each mover's host buffers once, as a run does
        m.offload()
        m.reload()
    pool = _Pool(movers, sync)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=on_gpu)
    back = torch.empty_like(flat)

    def d2h() -> None:
        host.copy_(flat, non_blocking=on_gpu)
        sync()

    def h2d() -> None:
        back.copy_(host, non_blocking=on_gpu)
        sync()

    def teardown() -> None:
        states.clear()
        movers.clear()
        storages.clear()
        if on_gpu:
            torch.cuda.empty_cache()

    # The same copies the mover makes, without its bookkeeping: one per storage of a resident
    # copy of the state. On CPU this separates the cost of many separately allocated storages
    # from the cost of the mover itself.
    extra = build_state(width, layers, device)
    storages = _storage_bytes(*extra)
    per_storage = torch.empty(
        sum(t.numel() for t in storages), dtype=torch.uint8, pin_memory=on_gpu
    )

    def d2h_per_storage() -> None:
        offset = 0
        for t in storages:
            per_storage[offset : offset + t.numel()].copy_(t, non_blocking=on_gpu)
            offset += t.numel()
        sync()

    mb = nbytes / 1e6
    where = torch.cuda.get_device_name(device) if on_gpu else "CPU (simulated device)"
    return Suite(
        cases=(
            Case("memcpy device->host", d2h, work=mb, work_unit="MB"),
            Case("memcpy host->device", h2d, work=mb, work_unit="MB"),
            Case("memcpy per storage device->host", d2h_per_storage, work=mb, work_unit="MB"),
            Case("offload (StateMover)", pool.offload, work=mb, work_unit="MB"),
            Case("reload (StateMover)", pool.reload, work=mb, work_unit="MB"),
        ),
        baseline="memcpy device->host",
        warmup=WARMUP,
        repeats=REPEATS,
        note=(
            f"State: MLP {layers} x Linear({width}, {width}) + AdamW after one step = {mb:.1f} MB "
            f"(weights, grads, optimizer moments) on {where}. Offload compares with "
            f"device->host, reload with host->device."
        ),
        teardown=teardown,
    )
