"""torch.distributed process groups for worker groups, set up by the runtime.

- :func:`init_group_process_group` (``group.init_process_group()``): the group's default process
  group, ``gloo`` on CPU / simulated devices, ``nccl`` on GPUs.
- :func:`create_collective`: a standalone process group over ranks of several groups (actor ranks
  then rollout ranks, for weight sync) with its own store; a worker gets it with
  ``self.collective(name)`` and uses its methods (``pg.broadcast(tensor, root).wait()``).

Rank 0 opens the rendezvous store (``TCPStore`` on port 0: the OS picks a free port, so sweep jobs
side by side never collide) and reports the port; the others then connect. Timeouts come from
``cluster.collective_timeout_s``. The groups are linked in the cluster so a failure in one tears
the others down rather than leaving them blocked in a collective.

The worker-side functions import torch; the driver side does not.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray

from rltrain.errors import WorkerError

if TYPE_CHECKING:
    from rltrain.scheduler.group import WorkerGroup

#: The config key the collectives' timeouts come from (named when one expires).
COLLECTIVE_TIMEOUT_KEY = "cluster.collective_timeout_s"


def _backend(groups: Sequence[WorkerGroup[Any]], backend: str | None) -> str:
    if backend is not None:
        if backend not in ("gloo", "nccl"):
            raise WorkerError(f"collective backend={backend!r} is not valid: choose gloo or nccl")
        return backend
    on_gpu = all(
        p.accelerator_type == "cuda" and p.device_ids for g in groups for p in g.placements
    )
    return "nccl" if on_gpu else "gloo"


# ------------------------------------------------------------------ worker side
def open_store(worker: Any, world_size: int, timeout_s: float) -> tuple[str, int]:
    """(rank 0) Open a TCPStore on a free port; keep it on the worker; return (addr, port)."""
    import torch.distributed as dist

    addr = ray.util.get_node_ip_address()
    store = dist.TCPStore(
        addr,
        0,
        world_size,
        True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    worker._rltrain_pending_store = store
    return addr, store.port


def _store(worker: Any, addr: str, port: int, world_size: int, is_master: bool, timeout_s: float):
    import torch.distributed as dist

    if is_master:
        return worker._rltrain_pending_store
    return dist.TCPStore(
        addr, port, world_size, False, timeout=datetime.timedelta(seconds=timeout_s)
    )


def init_default_group(
    worker: Any,
    backend: str,
    addr: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float,
) -> None:
    """(every rank) ``torch.distributed.init_process_group`` on the rank-0 store."""
    import torch.distributed as dist

    store = _store(worker, addr, port, world_size, rank == 0, timeout_s)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("default", store),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    worker._rltrain_default_store = store


def join_collective(
    worker: Any,
    name: str,
    backend: str,
    addr: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float,
) -> None:
    """(every member) Build the standalone process group ``name`` and keep it on the worker."""
    import torch.distributed as dist

    store = dist.PrefixStore(name, _store(worker, addr, port, world_size, rank == 0, timeout_s))
    timeout = datetime.timedelta(seconds=timeout_s)
    pg: Any
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    else:
        pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    worker._rltrain_collectives[name] = pg
    worker._rltrain_collective_stores = getattr(worker, "_rltrain_collective_stores", [])
    worker._rltrain_collective_stores.append(store)


# ------------------------------------------------------------------ driver side
def _rendezvous(
    first: WorkerGroup[Any], world_size: int, timeout_s: float, key: str | None
) -> tuple[str, int]:
    store = first.host_call("_rltrain_open_store", world_size, timeout_s, ranks=[0])
    return store.wait(timeout_s, key)[0]


def init_group_process_group(
    group: WorkerGroup[Any], backend: str | None = None, timeout_s: float | None = None
) -> None:
    """Create the default torch.distributed process group in every rank of ``group``.

    Raises:
        WorkerError: when a rank fails to join (the group is torn down).
        CallTimeoutError: a rank did not join within the timeout (named with its key; the
            job's teardown stops the groups).
    """
    key = COLLECTIVE_TIMEOUT_KEY if timeout_s is None else None  # a caller's own: no key
    timeout_s = group.cluster.collective_timeout_s if timeout_s is None else timeout_s
    backend = _backend([group], backend)
    world = group.world_size
    addr, port = _rendezvous(group, world, timeout_s, key)
    futures = [
        group.host_call(
            "_rltrain_init_process_group",
            ranks=[r],
            backend=backend,
            addr=addr,
            port=port,
            rank=r,
            world_size=world,
            timeout_s=timeout_s,
        )
        for r in range(world)
    ]
    for f in futures:
        f.wait(timeout_s + 30, key)


def create_collective(
    name: str,
    groups: Sequence[WorkerGroup[Any]],
    backend: str | None = None,
    timeout_s: float | None = None,
) -> dict[str, list[int]]:
    """Make a standalone process group over every rank of ``groups`` (in order).

    Collective rank 0 is ``groups[0]`` rank 0; the ranks of ``groups[1]`` follow those of
    ``groups[0]``, and so on. Views from ``execute_on`` contribute only their ranks.

    Args:
        name: the collective's name; workers get it with ``self.collective(name)``.
        groups: the worker groups (or views) taking part.
        backend: ``gloo`` or ``nccl``; None: nccl when every member uses GPUs.
        timeout_s: collective timeout (default ``cluster.collective_timeout_s``).

    Returns:
        Group name -> the collective ranks of its members (in the view's rank order).

    Raises:
        WorkerError: when a member fails to join (the linked groups are torn down).
        CallTimeoutError: a member did not join within the timeout (named with its key; the
            job's teardown stops the groups).
    """
    if not groups:
        raise WorkerError(f"create_collective({name!r}): give at least one group")
    cluster = groups[0].cluster
    key = COLLECTIVE_TIMEOUT_KEY if timeout_s is None else None  # a caller's own: no key
    timeout_s = cluster.collective_timeout_s if timeout_s is None else timeout_s
    backend = _backend(groups, backend)
    cluster.link(*(g.name for g in groups))
    members = [(g, r) for g in groups for r in g.ranks]
    world = len(members)
    first, first_rank = members[0]
    store = first.host_call("_rltrain_open_store", world, timeout_s, ranks=[first_rank])
    addr, port = store.wait(timeout_s, key)[0]
    futures = [
        g.host_call(
            "_rltrain_join_collective",
            ranks=[r],
            name=name,
            backend=backend,
            addr=addr,
            port=port,
            rank=i,
            world_size=world,
            timeout_s=timeout_s,
        )
        for i, (g, r) in enumerate(members)
    ]
    for f in futures:
        f.wait(timeout_s + 30, key)
    ranks: dict[str, list[int]] = {}
    for i, (g, _) in enumerate(members):
        ranks.setdefault(g.name, []).append(i)
    return ranks
