"""The weights the receivers hold: one object owns the version they are handed, each
receiver's transport, and what each was handed for that version.

A reasoning run hands its rollout (and an inference component) the actor's weights after every
update, through the transport the plan chose for each receiver
(:func:`~rltrain.placement.transport_choice.choose_transport`: the object store, CUDA IPC, or
a broadcast group). :class:`WeightHub` sets the transports up with both ends, queues the
exports behind the actor's update, records what each receiver is handed, and at the end leaves
no version in flight. The runner and its schedules call it; the worker classes are passed in
so the hub itself imports no worker.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from rltrain.kinds import registry
from rltrain.placement.transport_choice import TransportChoice, choose_transport


class WeightHub:
    """The version the receivers are handed, their transports, and what each holds.

    Args:
        job: the started job (its plan, cluster, stages and config).
        groups: the run's worker groups (``actor`` and ``receiver(name)``).
        actor_cls: the actor worker class (its ``setup_weight_sync``, ``export_weights``, ...).
        receiver_cls: the receiving worker class (``setup_weight_sync``, ``join_weight_sync``,
            ``catch_up``).
        fused: the rollout samples with the actor's own parameters: no transport, nothing sent.
    """

    def __init__(
        self, job: Any, groups: Any, actor_cls: Any, receiver_cls: Any, fused: bool = False
    ) -> None:
        self.job, self.run, self.g = job, job.run, groups
        self.actor_cls, self.receiver_cls = actor_cls, receiver_cls
        self.version = 0  # weights the receivers are handed; bumped by every update
        # What each receiver is handed for the newest version (see handed).
        self.weights: dict[str, Any] = {}
        self.transports: dict[str, TransportChoice] = {} if fused else self._setup()

    @classmethod
    def host_only(cls, job: Any, groups: Any, actor_cls: Any, receiver_cls: Any) -> WeightHub:
        """A hub whose one receiver, the rollout, loads host buckets packed by actor rank 0
        (the embodied runner's: its workers set nothing up)."""
        hub = cls(job, groups, actor_cls, receiver_cls, fused=True)
        why = "the embodied rollout loads the actor's host buckets"
        hub.transports = {"rollout": TransportChoice("host", why, feeders=((0, (0,)),))}
        return hub

    def handed_to(self, receiver: str) -> Any:
        """What ``receiver`` is handed for the newest weights (host buckets' object ref, IPC
        payloads by actor rank, or a collective version marker), or None."""
        return self.weights.get(receiver)

    def _setup(self) -> dict[str, TransportChoice]:
        """Choose each receiver's transport from the job's plan, tell both ends, and build the
        broadcast groups of the collective transport."""
        choices = {
            r: choose_transport(self.run, self.job.plan, r)
            for r in registry.weight_receivers()
            if self.g.receiver(r) is not None
        }
        self.g.actor.call(self.actor_cls.setup_weight_sync, choices).wait()
        for recv, choice in choices.items():
            members = self.g.receiver(recv).call(self.receiver_cls.setup_weight_sync, choice)
            members = members.wait()
            if choice.name == "collective":
                self._join_broadcast_groups(recv, choice, members)
        return choices

    def _join_broadcast_groups(
        self, recv: str, choice: TransportChoice, members: list[int]
    ) -> None:
        """One group per source actor rank: the source (rank 0) and the receivers it feeds
        (a vLLM receiver brings one member per tensor-parallel worker)."""
        timeout = self.run.cluster.collective_timeout_s
        actor, receivers = self.g.actor, self.g.receiver(recv)
        self.job.cluster.link(actor.name, receivers.name)  # a failure tears down both ends
        pending = []
        for src in choice.sources:
            ranks = choice.receivers_of(src)
            world = 1 + sum(members[r] for r in ranks)
            host, port = actor.execute_on(src).call(self.actor_cls.open_weight_sync).wait()[0]
            pending.append(
                actor.execute_on(src).call(
                    self.actor_cls.join_weight_sync, recv, host, port, world, timeout
                )
            )
            first = 1
            for r in ranks:
                pending.append(
                    receivers.execute_on(r).call(
                        self.receiver_cls.join_weight_sync,
                        choice.backend or "gloo",
                        host,
                        port,
                        world,
                        first,
                        timeout,
                    )
                )
                first += members[r]
        for f in pending:
            f.wait(timeout + 30, "cluster.collective_timeout_s")

    def submit_exports(self, version: int) -> dict[str, Any]:
        """Queue the export of ``version`` for every receiver on its source actor ranks (behind
        whatever those ranks run now); :meth:`handed` turns the answers into what the
        receivers are handed. Receivers on the object store share one export."""
        out: dict[str, Any] = {}
        host_future = None
        for recv, choice in self.transports.items():
            if choice.name == "host" and host_future is not None:
                out[recv] = host_future
                continue
            fut = self.g.actor.execute_on(*choice.sources).call(
                self.actor_cls.export_weights, version, recv
            )
            if choice.name == "host":
                host_future = fut
            out[recv] = fut
        return out

    def handed(self, version: int, futures: dict[str, Any]) -> None:
        """Wait for the exports and record what each receiver is handed for ``version``."""
        from rltrain.backends.weight_sync.transport import CollectiveVersion

        for recv, fut in futures.items():
            choice = self.transports[recv]
            results = fut.wait()
            if choice.name == "host":
                self.weights[recv] = fut.refs[0]  # resolved by Ray as a call argument
            elif choice.name == "ipc":
                self.weights[recv] = dict(zip(choice.sources, results, strict=True))
            else:
                self.weights[recv] = CollectiveVersion(version)

    def export(self, version: int, lease: bool = True) -> None:
        """Hand every receiver ``version`` (inside the actor's lease: it must be resident; the
        receivers load it at their next call, when they hold their own lease). ``lease=False``:
        the caller holds the actor's lease already."""
        with self.job.stage("actor") if lease else nullcontext():
            self.handed(version, self.submit_exports(version))
        self.version = version

    def catch_up(self, recv: str) -> None:
        """Collective transport: every receiver rank takes the versions broadcast so far (a
        broadcast needs all of its group, so a call on some ranks only must come after)."""
        from rltrain.backends.weight_sync.transport import CollectiveVersion

        weights = self.weights.get(recv)
        if isinstance(weights, CollectiveVersion):
            with self.job.stage(recv):
                self.g.receiver(recv).call(self.receiver_cls.catch_up, weights).wait()

    def finish(self) -> None:
        """Leave no version in flight: receivers take the last broadcast, IPC buckets go."""
        timeout = self.run.cluster.collective_timeout_s
        for recv, choice in self.transports.items():
            sources = self.g.actor.execute_on(*choice.sources)
            if choice.name == "collective":
                self.catch_up(recv)
                sources.call(self.actor_cls.flush_weight_sync, timeout).wait()
            elif choice.name == "ipc":
                sources.call(self.actor_cls.release_weights, recv).wait()
