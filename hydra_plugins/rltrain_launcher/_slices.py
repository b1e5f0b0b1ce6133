"""Device slices: where on the cluster each concurrently running job's devices go.

Pure logic (no Ray, no Hydra). A job's plan names devices as ``(node_rank, local_device)`` in the
cluster it was planned against. To run several jobs side by side, each job's devices are mapped
onto a slice of free devices: every job node onto its own cluster node with enough free devices
(and at least as many devices as the job numbers there), the job's devices of that node onto free
devices of that node in order. A job keeps its planned devices when they are free (so a
one-at-a-time sweep runs each job exactly where it was planned). The job reads its slice
(``RLTRAIN_DEVICE_SLICE``) when it discovers the cluster and reserves each of its nodes' devices
on the cluster node the slice names (:func:`rltrain.scheduler.discovery.apply_node_map`); Ray
picks which free devices of that node back them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Device = tuple[int, int]  # (node_rank, local_device)


@dataclass(frozen=True)
class DeviceSlice:
    """A job's devices mapped onto the cluster.

    Attributes:
        mapping: ``((job_node, job_device), (cluster_node, cluster_device))`` pairs, sorted.
    """

    mapping: tuple[tuple[Device, Device], ...] = ()

    @property
    def devices(self) -> frozenset[Device]:
        """The cluster devices the slice holds."""
        return frozenset(dst for _, dst in self.mapping)

    def node_map(self) -> dict[int, int]:
        """Job node rank -> cluster node rank."""
        return {src[0]: dst[0] for src, dst in self.mapping}

    def to_json(self) -> str:
        """The slice as passed to a job (``RLTRAIN_DEVICE_SLICE``): a list of
        ``{"job": [node, device], "cluster": [node, device]}`` objects."""
        return json.dumps(
            [{"job": list(src), "cluster": list(dst)} for src, dst in self.mapping],
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> DeviceSlice:
        """Inverse of :meth:`to_json`."""
        items = json.loads(text)
        return cls(
            tuple(sorted((tuple(it["job"]), tuple(it["cluster"])) for it in items))  # type: ignore[misc]
        )

    def describe(self) -> str:
        """Short text for logs and the report, e.g. ``n0:d0,d1``."""
        by_node: dict[int, list[int]] = {}
        for node, dev in sorted(self.devices):
            by_node.setdefault(node, []).append(dev)
        return " ".join(f"n{n}:" + ",".join(f"d{d}" for d in ds) for n, ds in by_node.items())


def _by_node(devices: Iterable[Device]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for node, dev in sorted(devices):
        out.setdefault(node, []).append(dev)
    return out


class SliceAllocator:
    """Hands out disjoint device slices of one cluster.

    Args:
        capacity: devices per cluster node, ``{node_rank: num_devices}``.
        movable: whether a job node may run on another cluster node than its own. Not with
            ``cluster.node_groups``: a configured group names the job's node ranks, which a
            move would hand to nodes of other groups.
    """

    def __init__(self, capacity: Mapping[int, int], movable: bool = True) -> None:
        self.capacity = dict(capacity)
        self.movable = movable
        self._free: dict[int, set[int]] = {n: set(range(c)) for n, c in self.capacity.items()}

    @property
    def free(self) -> frozenset[Device]:
        """Devices no slice holds now."""
        return frozenset((n, d) for n, ds in self._free.items() for d in ds)

    def never_fits(self, needs: Iterable[Device]) -> str | None:
        """Why a job could not run even on the empty cluster, or None when it could.

        Args:
            needs: the job's planned devices.

        Returns:
            A sentence naming what the job needs and what the cluster has, or None.
        """
        wanted = _by_node(needs)
        empty = {n: set(range(c)) for n, c in self.capacity.items()}
        if self._assign(wanted, empty, self.capacity, self.movable) is not None:
            return None
        shape = ", ".join(f"{len(ds)} on job node {n}" for n, ds in wanted.items())
        have = ", ".join(f"node {n}: {c}" for n, c in sorted(self.capacity.items())) or "none"
        return (
            f"the plan needs devices ({shape}), each job node on its own cluster node, but the "
            f"cluster has {have} devices per node"
        )

    def allocate(self, needs: Iterable[Device]) -> DeviceSlice | None:
        """Reserve a slice for a job.

        Args:
            needs: the job's planned devices (empty for a job that needs none).

        Returns:
            The slice (empty for an empty ``needs``), or None when it does not fit now.
        """
        wanted = _by_node(needs)
        node_map = self._assign(wanted, self._free, self.capacity, self.movable)
        if node_map is None:
            return None
        pairs = []
        for job_node, devs in wanted.items():
            node = node_map[job_node]
            planned = set(devs)
            # Keep the planned devices when they are free; else the lowest free ones, in order.
            chosen = devs if planned <= self._free[node] else sorted(self._free[node])[: len(devs)]
            self._free[node] -= set(chosen)
            pairs.extend(((job_node, d), (node, c)) for d, c in zip(devs, chosen, strict=True))
        return DeviceSlice(tuple(sorted(pairs)))

    def release(self, piece: DeviceSlice) -> None:
        """Return a slice's devices."""
        for node, dev in piece.devices:
            self._free[node].add(dev)

    @staticmethod
    def _assign(
        wanted: dict[int, list[int]],
        free: dict[int, set[int]],
        capacity: Mapping[int, int],
        movable: bool = True,
    ) -> dict[int, int] | None:
        """Job node -> cluster node, each cluster node used once; None when impossible.

        Greedy: job nodes needing the most devices first; each takes its own rank when its
        planned devices are free there, else the node with the fewest free devices that still
        fits (best fit keeps large holes for large jobs). A job node only goes to a node with a
        device for each of its planned device numbers: the job sees that node as its own and
        places its processes on those numbers.
        """
        taken: set[int] = set()
        out: dict[int, int] = {}
        for job_node in sorted(wanted, key=lambda n: (-len(wanted[n]), n)):
            devs = wanted[job_node]
            if job_node in free and job_node not in taken and set(devs) <= free[job_node]:
                out[job_node] = job_node
                taken.add(job_node)
                continue
            if not movable:  # its own node only: wait until its planned devices are free
                return None
            options = [
                (len(free[n]), n)
                for n in free
                if n not in taken and len(free[n]) >= len(devs) and capacity[n] > max(devs)
            ]
            if not options:
                return None
            out[job_node] = min(options)[1]
            taken.add(out[job_node])
        return out
