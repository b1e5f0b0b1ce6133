"""Device residency: components that share a device take turns, by their offload policies.

One coordinator per job lives in the driver. The driver takes a lease for a stage at the stage
boundary (``with coordinator.stage("rollout"):``); the coordinator decides, for every device the
stage's processes use, which other residents must leave and which of their state kinds, checks
that the stage then fits everywhere (all-or-nothing), awaits the evictions, reloads the stage's
own offloaded state, and after the stage offloads it again when its policy is ``after_stage``.

Why the driver and not the workers: a worker asking for room from inside its own method would
deadlock when the grant must call ``offload()`` on another busy single-threaded actor.

The decision logic is pure (:meth:`ResidencyCoordinator.plan_stage`) and tested without Ray; the
actions go through a small :class:`ResidentHandle` protocol that the worker groups implement.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from rltrain.config.offload import OffloadPolicy
from rltrain.errors import ResourceError
from rltrain.placement.plan import evictions as rule_evictions
from rltrain.placement.types import GIB

Device = tuple[int, int]  # (node rank, local device id)


class ResidentHandle(Protocol):
    """What the coordinator needs from one process of a component (a worker, or its proxy)."""

    def offload(self, kinds: Sequence[str]) -> Any:
        """Move the given state kinds off the device. May return a future with ``wait()``:
        the coordinator starts all moves of a phase, then waits for all of them."""

    def reload(self, kinds: Sequence[str]) -> Any:
        """Bring the given state kinds back onto the device (may return a future)."""


@dataclass
class Resident:
    """One process of a component and the bytes it holds per device, by state kind."""

    component: str
    rank: int
    devices: tuple[Device, ...]
    policy: OffloadPolicy
    total: dict[str, int]  # bytes per kind when fully resident (per device the process uses)
    offloaded: set[str] = field(default_factory=set)
    stage_extra: int = 0  # transient bytes the stage needs on top (activations, KV growth)
    # The plan's bytes per state kind, standing in for a kind the process has not created yet
    # (measured 0: an optimizer before its first step, gradients before the first backward,
    # which its own stage creates); the measured size replaces it once it exists.
    planned: dict[str, int] = field(default_factory=dict)

    def resident_bytes(self) -> int:
        return sum(b for k, b in self.total.items() if k not in self.offloaded)

    def unmade(self) -> int:
        """Planned bytes of the kinds not created yet: what the process's stage adds to
        :meth:`resident_bytes` when it creates them."""
        return sum(b for k, b in self.planned.items() if not self.total.get(k))

    def movable(self) -> dict[str, int]:
        """Bytes per kind that the policy lets leave and that are on the device now (a kind of
        0 bytes, an optimizer before its first step, has nothing to move)."""
        return {
            k: b
            for k, b in self.total.items()
            if b and k not in self.offloaded and self.policy.may_offload(k)
        }


@dataclass(frozen=True)
class Eviction:
    component: str
    rank: int
    kinds: tuple[str, ...]
    bytes: int


@dataclass(frozen=True)
class StagePlan:
    """What happens before a stage runs: evictions of others, then reloads of its own state."""

    component: str
    evictions: tuple[Eviction, ...]
    reloads: tuple[tuple[int, tuple[str, ...]], ...]  # (rank, kinds)


@dataclass(frozen=True)
class ResidencyEvent:
    """One grant, offload or reload, with timestamps, for the timeline and the tests."""

    kind: str  # grant | offload | reload | release
    component: str
    rank: int
    kinds: tuple[str, ...]
    bytes: int
    start: float
    end: float


def _gib(b: float) -> str:
    return f"{b / GIB:.2f} GiB"


class ResidencyCoordinator:
    """Grants stage leases on shared devices, evicting residents by their offload policies.

    Args:
        capacity: bytes available per device.
        clock: time source for event timestamps.
    """

    def __init__(self, capacity: Mapping[Device, int], clock=time.monotonic) -> None:
        self.capacity = dict(capacity)
        self.residents: dict[tuple[str, int], Resident] = {}
        self.handles: dict[tuple[str, int], ResidentHandle] = {}
        self.events: list[ResidencyEvent] = []
        self.peak: dict[Device, int] = {d: 0 for d in self.capacity}
        self._active: set[str] = set()  # holding a lease: their stage_extra and unmade count
        self._pending: list[tuple] = []  # moves started and not yet awaited (see stage())
        self._clock = clock

    # ---------------------------------------------------------------------------- registration
    def register(self, resident: Resident, handle: ResidentHandle | None = None) -> None:
        """Add a process and its state sizes; it starts fully resident unless marked offloaded."""
        for d in resident.devices:
            if d not in self.capacity:
                raise ResourceError(
                    f"{resident.component} rank {resident.rank} uses device {d}, which the "
                    f"coordinator was not given a capacity for"
                )
        key = (resident.component, resident.rank)
        self.residents[key] = resident
        if handle is not None:
            self.handles[key] = handle
        self._note_peak()

    def refresh(self, component: str, rank: int, total: Mapping[str, int]) -> None:
        """Replace a process's full-state sizes with newly measured ones and note the peak.

        A worker measures its state after an update, in its stage: the optimizer's state first
        exists then, and the device held it beside whatever was resident.

        Args:
            component: the component.
            rank: the process's rank; an unregistered process is ignored.
            total: bytes per state kind when fully resident (``ResidentState.state_bytes``).
        """
        resident = self.residents.get((component, rank))
        if resident is None:
            return
        resident.total = {k: int(v) for k, v in total.items()}
        self._note_peak()

    def usage(self, device: Device) -> int:
        """Bytes resident on a device now, over every process that uses it (a process in its
        stage also holds its transient bytes and the state the stage creates)."""
        return sum(
            r.resident_bytes() + (r.stage_extra + r.unmade() if r.component in self._active else 0)
            for r in self.residents.values()
            if device in r.devices
        )

    # -------------------------------------------------------------------------------- decisions
    def plan_stage(self, component: str) -> StagePlan:
        """Decide what must leave so that ``component``'s stage fits on all its devices.

        The stage needs its processes' full state, the state they have not created yet at its
        planned size (:attr:`Resident.planned`) and their transient bytes.

        Evicts on-demand residents before after-stage ones (after-stage residents normally left
        already), each by the plan's rule (:func:`~rltrain.placement.plan.evictions`: the
        resident with the most movable bytes first, its larger kinds first, only as far as the
        stage needs), and only from devices the stage uses.

        Raises:
            ResourceError: when even evicting everything the policies allow cannot make room;
                the message names the device, the residents, the shortfall and the fix.
        """
        mine = [r for r in self.residents.values() if r.component == component]
        if not mine:
            raise ResourceError(f"no processes of component {component!r} are registered")
        reloads = tuple((r.rank, tuple(sorted(r.offloaded))) for r in mine if r.offloaded)
        devices = sorted({d for r in mine for d in r.devices})
        chosen: dict[tuple[str, int], set[str]] = {}
        for dev in devices:
            need = sum(
                sum(r.total.values()) + r.unmade() + r.stage_extra for r in mine if dev in r.devices
            )
            others = [
                r for r in self.residents.values() if r.component != component and dev in r.devices
            ]
            held = sum(
                b
                for r in others
                for k, b in r.total.items()
                if k not in r.offloaded and k not in chosen.get((r.component, r.rank), set())
            )
            free = self.capacity[dev] - held
            for on_demand in (True, False):
                movable = {
                    (r.component, r.rank): {
                        k: b
                        for k, b in r.movable().items()
                        if k not in chosen.get((r.component, r.rank), set())
                    }
                    for r in others
                    if (r.policy.when == "on_demand") == on_demand
                }
                for key, kind, b in rule_evictions(movable, need - free):
                    chosen.setdefault(key, set()).add(kind)
                    free += b
            if free < need:
                raise ResourceError(self._explain_shortfall(component, dev, need, free, others))
        evictions = tuple(
            Eviction(
                c,
                rank,
                tuple(sorted(kinds)),
                sum(self.residents[(c, rank)].total[k] for k in kinds),
            )
            for (c, rank), kinds in sorted(chosen.items())
            if kinds
        )
        return StagePlan(component, evictions, reloads)

    def _explain_shortfall(
        self, component: str, dev: Device, need: int, free: int, others: list[Resident]
    ) -> str:
        held = (
            ", ".join(
                f"{r.component} rank {r.rank} {_gib(r.resident_bytes())} "
                f"(may offload: {sorted(r.policy.states) if r.policy.enabled else 'nothing'})"
                for r in others
            )
            or "none"
        )
        fixes = [
            f"placement.offload.{r.component}.when=after_stage or on_demand with states "
            f"{sorted(k for k in r.total if k not in r.policy.states or not r.policy.enabled)}"
            for r in others
            if any(not r.policy.may_offload(k) for k in r.total if r.total[k])
        ]
        fix = "; ".join(dict.fromkeys(fixes)) or (
            "give the components their own devices or raise cluster.device_memory_gib"
        )
        return (
            f"{component} needs {_gib(need)} on device {dev} (capacity {_gib(self.capacity[dev])})"
            f" but only {_gib(max(free, 0))} can be freed; residents: {held}. "
            f"Shortfall {_gib(need - free)}. Fix: {fix}"
        )

    # ---------------------------------------------------------------------------------- actions
    @contextmanager
    def stage(self, component: str) -> Iterator[StagePlan]:
        """Hold a lease on the devices of ``component`` for the duration of a stage.

        Moves are started as early and awaited as late as their order allows, so that a stage
        costs the driver no extra round trip for them:

        - moves left over from earlier stages (the ``after_stage`` offloads below) are awaited
          first when this stage needs the room they free; when it fits with them still on the
          device (the policy moved them, not a shortage), it starts at once;
        - evictions of other components are awaited before any reload starts (the room must
          exist before it is used);
        - this component's reloads are started and awaited only when the lease ends: a worker
          runs its calls in submission order, so the stage's own calls queue behind the reload;
        - after the body, an ``after_stage`` component's state is sent away without waiting
          (it queues behind the stage's calls on the same worker) and awaited at the next
          lease, :meth:`flush` or :meth:`offload_all`.

        The byte accounting changes when a move starts, so ``usage`` and ``peak`` describe the
        device as the stage sees it. After a failed stage the workers may be gone: the lease is
        released, its pending reloads are dropped and nothing more moves.
        """
        self._await_pending_if_needed(component)
        plan = self.plan_stage(component)
        self._finish([self._act("offload", e.component, e.rank, e.kinds) for e in plan.evictions])
        reloads = [self._act("reload", component, rank, kinds) for rank, kinds in plan.reloads]
        start = self._clock()
        self._active.add(component)
        self._note_peak()
        try:
            yield plan
        except BaseException:
            self._active.discard(component)
            raise
        finally:
            self.events.append(ResidencyEvent("grant", component, -1, (), 0, start, self._clock()))
        self._active.discard(component)
        self._finish(reloads)
        self._pending.extend(
            self._act("offload", component, r.rank, tuple(sorted(r.movable())))
            for r in self.residents.values()
            if r.component == component and r.policy.when == "after_stage" and r.movable()
        )

    def set_policy(self, component: str, when: str) -> None:
        """Change when ``component``'s state leaves (benchmarks compare policies on one job).

        Its state moves to match at once: ``after_stage`` sends it away now (as if its last
        stage had just ended); the others leave it where it is.
        """
        for r in self.residents.values():
            if r.component == component:
                r.policy = OffloadPolicy(when=when, states=r.policy.states)
        if when == "after_stage":
            self.offload_all(component)

    def _await_pending_if_needed(self, component: str) -> None:
        self._pending = [m for m in self._pending if not self._reaped(m)]
        if not self._pending:
            return
        # Plan as if the moves in flight had not happened: if the stage fits so, nothing
        # needs to wait for them.
        undo = [(self.residents[(c, r)], set(k)) for what, c, r, k, *_ in self._pending]
        for res, kinds in undo:
            res.offloaded -= kinds
        try:
            fits = not self.plan_stage(component).evictions
        except ResourceError:
            fits = False
        finally:
            for res, kinds in undo:
                res.offloaded |= kinds
        if not fits:
            self.flush()

    def _reaped(self, move: tuple) -> bool:
        """Record a move in flight that has finished (without blocking); True if it had."""
        waiter = move[-1]
        if waiter is not None and hasattr(waiter, "done") and not waiter.done():
            return False
        self._finish([move])
        return True

    def flush(self) -> None:
        """Await every move started and not yet awaited (before reading worker memory)."""
        pending, self._pending = self._pending, []
        self._finish(pending)

    def offload_all(self, component: str) -> None:
        """Offload everything the policy allows, from every process of ``component``."""
        self.flush()
        self._finish(
            [
                self._act("offload", component, r.rank, tuple(sorted(r.movable())))
                for r in self.residents.values()
                if r.component == component and r.policy.when != "never" and r.movable()
            ]
        )

    def _act(self, what: str, component: str, rank: int, kinds: tuple[str, ...]) -> tuple:
        """Start one move and account for it; :meth:`_finish` awaits it and records it."""
        handle = self.handles.get((component, rank))
        start = self._clock()
        waiter = getattr(handle, what)(list(kinds)) if handle is not None else None
        r = self.residents[(component, rank)]
        if what == "offload":
            r.offloaded |= set(kinds)
        else:
            r.offloaded -= set(kinds)
            self._note_peak()
        return (what, component, rank, kinds, start, waiter)

    def _finish(self, pending: list[tuple]) -> None:
        for what, component, rank, kinds, start, waiter in pending:
            if waiter is not None and hasattr(waiter, "wait"):
                waiter.wait()
            r = self.residents[(component, rank)]
            moved = sum(r.total.get(k, 0) for k in kinds)
            self.events.append(
                ResidencyEvent(what, component, rank, kinds, moved, start, self._clock())
            )

    def _note_peak(self) -> None:
        for d in self.capacity:
            self.peak[d] = max(self.peak[d], self.usage(d))

    def counts(self) -> dict[tuple[str, str], int]:
        """How many offloads and reloads each component started: {(component, kind): n}."""
        moves = [(e.kind, e.component) for e in self.events if e.kind in ("offload", "reload")]
        moves += [(what, component) for what, component, *_ in self._pending]
        out: dict[tuple[str, str], int] = {}
        for kind, component in moves:
            out[(component, kind)] = out.get((component, kind), 0) + 1
        return out
