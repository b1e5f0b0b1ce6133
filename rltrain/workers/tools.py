"""The tool pool of multi-turn runs: component ``tools``, its workers and the client the
generating processes send their episodes' steps through.

Each :class:`ToolWorker` is a Ray actor (placed by the plan on CPU nodes by default, see
:mod:`rltrain.placement.tools`) hosting environment instances of ``task.env`` by episode key and
running their steps on ``tools.concurrency`` threads. The rollout's (or fused) processes hold a
:class:`RayToolPool` over every worker of the pool: an episode's environment is opened on one
worker (round robin) and all its steps go there, so a tool keeps its state between calls.

Faults: a tool that raises or runs longer than ``tools.timeout_s`` (timed from when one of the
worker's threads takes the call, :func:`~rltrain.agents.interaction.timed_step`) fails its episode
(infra failure, :mod:`rltrain.agents.interaction`), as does an environment ``reset`` that runs
longer than ``tools.timeout_s`` (closed when that reset returns after all; a ``reset`` that
raises stops the run). A tool worker that dies
(its process killed, out of memory) fails every episode waiting on it, and the batch's
``generate`` then raises a ``WorkerError`` naming the worker: the run stops (the pool does not
replace workers; their environments' state is gone with them).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rltrain.agents.interaction import (
    EpisodeSettings,
    ToolReply,
    ToolReset,
    ToolStep,
    ToolTimeout,
    timed_reset,
    timed_step,
)
from rltrain.config.schema import RunConfig
from rltrain.errors import WorkerError
from rltrain.placement.types import GIB
from rltrain.scheduler import Worker
from rltrain.scheduler.group import WorkerGroupBuilder
from rltrain.scheduler.resources import ProcessAsk
from rltrain.tasks.text_env import load_env_class


@dataclass(frozen=True)
class ToolWorkerState:
    """What one tool worker reports about itself.

    Attributes:
        rank: its rank in the pool.
        node: the cluster node it runs on.
        pid: its process id.
        open_envs: environments it hosts now.
        steps: steps it has run.
        resources: what Ray assigned it (``CPU``: ``tools.cpus_per_worker``, ``memory``:
            ``tools.memory_gib_per_worker`` in bytes).
    """

    rank: int
    node: int
    pid: int
    open_envs: int
    steps: int
    resources: Mapping[str, float]


class _PoolBuilder(WorkerGroupBuilder):
    """Starts tool workers with ``tools.concurrency`` call threads each; each asks Ray for
    ``tools.cpus_per_worker`` CPUs and ``tools.memory_gib_per_worker`` of memory (the
    reservation's slot, which also gives it ``max(1, int(cpus))`` torch threads)."""

    def __init__(self, run: RunConfig) -> None:
        super().__init__(ToolWorker, (run,), {})
        self.concurrency = run.tools.concurrency
        self.process_ask = ProcessAsk(
            run.tools.cpus_per_worker, int(run.tools.memory_gib_per_worker * GIB)
        )

    def launch(self, cluster: Any, name: str, placement_strategy: Any, **kw: Any) -> Any:
        kw["max_concurrency"] = self.concurrency
        return super().launch(cluster, name, placement_strategy, **kw)


class ToolWorker(Worker):
    """One worker of the tool pool: hosts environments, runs their steps.

    Args:
        run: the checked run config (``task.env``, ``tools.*``, ``simulate.*``).

    Raises:
        ConfigError: ``task.env`` does not load here (its package missing on this node).
    """

    @classmethod
    def create_group(cls, run: RunConfig) -> _PoolBuilder:  # type: ignore[override]
        """The pool's group builder (threads per worker from ``tools.*``)."""
        return _PoolBuilder(run)

    def __init__(self, run: RunConfig) -> None:
        self.env_class = load_env_class(run.task.env)
        self.settings = EpisodeSettings.from_run(run)
        self.envs: dict[str, Any] = {}
        self.lock = threading.Lock()  # steps of different episodes run on several threads
        self.steps = 0

    def reset(self, msg: ToolReset) -> str:
        """Open an episode's environment here; returns its first observation.

        Raises:
            ToolTimeout: the reset ran longer than ``tools.timeout_s`` (timed from now; the
                client fails the episode). The environment is not kept: it is closed when the
                reset returns after all (:func:`~rltrain.agents.interaction.timed_reset`).
            Exception: what the environment's ``reset`` raised.
        """
        env = self.env_class()
        first = timed_reset(env, msg.example, self.settings)
        with self.lock:
            self.envs[msg.key] = env
        return first

    def step(self, msg: ToolStep) -> ToolReply:
        """Run one action on an episode's environment (latency and failures of
        ``simulate.*`` applied to tool calls).

        Raises:
            WorkerError: no environment is open under the key.
            ToolTimeout: the step ran longer than ``tools.timeout_s`` (timed from now).
            Exception: what the environment raised (the client fails the episode).
        """
        with self.lock:
            env = self.envs.get(msg.key)
            self.steps += 1
        if env is None:
            raise WorkerError(f"tool worker rank {self.rank}: no environment open as {msg.key!r}")
        return timed_step(env, msg.action, msg.failure_seed, self.settings)

    def close(self, keys: Sequence[str]) -> int:
        """Close the episodes' environments; returns how many were open."""
        closed = 0
        for key in keys:
            with self.lock:
                env = self.envs.pop(key, None)
            if env is not None:
                env.close()
                closed += 1
        return closed

    def state(self) -> ToolWorkerState:
        """Where it runs and what it holds."""
        import ray

        assigned = ray.get_runtime_context().get_assigned_resources()
        with self.lock:
            return ToolWorkerState(
                self.rank,
                self.placement.cluster_node_rank,
                os.getpid(),
                len(self.envs),
                self.steps,
                assigned,
            )


class RayToolPool:
    """The generating process's view of the pool: episodes opened round robin over the tool
    workers, each episode's steps sent to its worker.

    Args:
        actors: the pool's actor handles, rank order.
    """

    def __init__(self, actors: Sequence[Any]) -> None:
        if not actors:
            raise WorkerError("the tool pool has no workers (tools.pool_size must be >= 1)")
        self.actors = list(actors)
        self.client = uuid.uuid4().hex[:12]  # several processes share the pool's workers
        self.opened = 0
        self.dead: dict[int, str] = {}
        self.issued: list[tuple[int, Future]] = []  # steps whose worker check() looks at

    def open(self, examples: Sequence[Any]) -> list[tuple[Any, str | None]]:
        """Open one environment per example; ``((rank, key), first observation)`` each, and
        ``(None, None)`` for a reset that ran longer than ``tools.timeout_s`` (its episode
        fails; the worker's thread bounds the wait, so no reset holds the batch longer).

        Raises:
            WorkerError: a worker could not reset (its environment raised, or it died).
        """
        import ray

        handles = []
        for example in examples:
            rank = self.opened % len(self.actors)
            handles.append((rank, f"{self.client}:{self.opened}", example))
            self.opened += 1
        refs = [self.actors[r].reset.remote(ToolReset(k, ex)) for r, k, ex in handles]
        out: list[tuple[Any, str | None]] = []
        for (r, k, _), ref in zip(handles, refs, strict=True):
            try:
                out.append(((r, k), ray.get(ref)))
            except ToolTimeout:  # Ray raises the task's error as an instance of its cause
                out.append((None, None))
            except ray.exceptions.RayError as exc:
                raise WorkerError(f"the tool pool could not open an episode: {exc}") from exc
        return out

    def step(self, handle: Any, action: str, failure_seed: int | None) -> Future:
        """Send one action to the episode's worker; a future of its :class:`ToolReply`."""
        rank, key = handle
        future = self.actors[rank].step.remote(ToolStep(key, action, failure_seed)).future()
        self.issued.append((rank, future))
        return future

    def _note_deaths(self) -> None:
        """Look at the finished steps since the last look: a worker's death shows there."""
        import ray

        waiting = []
        for rank, future in self.issued:
            if not future.done():
                waiting.append((rank, future))
                continue
            exc = None if future.cancelled() else future.exception()
            if isinstance(exc, ray.exceptions.RayActorError):
                self.dead.setdefault(rank, (str(exc).splitlines() or [type(exc).__name__])[0])
        self.issued = waiting

    def close(self, handles: Sequence[Any]) -> None:
        """Close the episodes' environments (not waited for; a dead worker is skipped)."""
        keys: dict[int, list[str]] = {}
        for rank, key in handles:
            keys.setdefault(rank, []).append(key)
        for rank, ks in keys.items():
            if rank not in self.dead:
                self.actors[rank].close.remote(ks)

    def check(self) -> None:
        """Raises:
        WorkerError: a tool worker died; the run stops (the pool does not replace it)."""
        self._note_deaths()
        if self.dead:
            ranks = sorted(self.dead)
            raise WorkerError(
                f"tool worker(s) {ranks} of the tool pool died ({self.dead[ranks[0]]}): their "
                f"episodes were failed (rollout/infra_failed) and the run stops, since the pool "
                f"does not replace workers. Check the node's memory (tools.memory_gib_per_worker) "
                f"and the environment's code, then resume (trainer.resume=auto)"
            )


def pool_summary(group: Any) -> dict[str, Any]:
    """The job summary's ``tool_pool``: each tool worker's node, and the steps it served.

    Args:
        group: the started ``tools`` worker group.

    Returns:
        ``{"workers": n, "nodes": [node per rank], "steps": [steps per rank],
        "cpus": [Ray CPUs per rank], "memory_gib": [Ray memory per rank]}``.
    """
    states = group.call(ToolWorker.state).wait()
    return {
        "workers": len(states),
        "nodes": [s.node for s in states],
        "steps": [s.steps for s in states],
        "cpus": [s.resources.get("CPU", 0.0) for s in states],
        "memory_gib": [s.resources.get("memory", 0.0) / 2**30 for s in states],
    }
