"""Bounded-staleness rollout pipeline: generation for the next steps runs while the actor trains.

The reasoning runner (``trainer.max_staleness = k >= 1``) asks this schedule, before step ``s``
trains, to have the generations of steps up to ``s + k`` in flight, and takes step ``s``'s batch
from it. Each generation records the weight version it samples with, so the staleness of every
batch is known. What happens to a generation still running when the actor publishes newer
weights is ``trainer.partial_rollout``:

- ``finish``: it runs to the end with the weights it started with (its batch is stale);
- ``restart``: it is cancelled and submitted again with the newest weights (its batch is fresh;
  the work done so far is lost);
- ``continue``: it is paused and continued with the newest weights: the rollout keeps the tokens
  sampled so far (and their behaviour log-probs and versions) and samples the rest with the new
  weights. The batch's staleness still counts from the version that started it;
- ``carry``: nothing is cancelled; each rollout rank carries the rows a call has not finished
  into its next call (:mod:`rltrain.whatif.slots`). The pipeline then runs one generation
  ahead, so a group may be carried for ``k - 1`` calls within the bound; a call finishes the
  groups the next call would drop (``due_version``), and the rollout drops any group past the
  bound (``oldest_version``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from rltrain.errors import ConfigError, WorkerError
from rltrain.runners.staleness import over_bound, staleness


class Generator(Protocol):
    """What the pipeline needs of the step's stages
    (:class:`~rltrain.runners.stages.ReasoningStages`; unit tests pass a stand-in)."""

    version: int  # the newest weights handed to the rollout
    job: Any  # ``job.stage(component)``: a component's turn on its devices
    sizes: Any  # ``samples_per_step``, ``rollout_dp``

    def submit_generation(
        self, step: int, expect_version: int, *, resume: bool = False, policy: str | None = None
    ) -> Any:
        """Start a generation on every rollout rank; returns its group future."""
        ...


PARTIAL_ROLLOUTS = ("finish", "restart", "continue", "carry")


@dataclass(frozen=True)
class InFlight:
    """A generation submitted ahead.

    Attributes:
        step: the step whose batch it generates.
        version: the weight version it samples with.
        future: the rollout group's future (``wait()``, ``done()``, ``refs``).
        restarts: how often this step's generation was restarted before this submission.
        started: the version its first tokens were sampled with (``version`` unless it
            continues a paused generation: ``partial_rollout=continue``).
        continues: how often it was paused and continued.
    """

    step: int
    version: int
    future: Any
    restarts: int = 0
    started: int = -1
    continues: int = 0

    @property
    def first_version(self) -> int:
        """The version its oldest tokens were sampled with (staleness counts from it)."""
        return self.version if self.started < 0 else self.started


class GenerationPipeline:
    """Bounded-staleness schedule: generation for steps ahead runs while the actor trains.

    Before step ``s`` trains, the generations of steps up to ``s + k`` are submitted with the
    newest exported weights (version ``s``: every update bumps it), so a batch of step ``t`` is
    sampled with a version ``>= t - k``. At most ``k + 1`` generations are queued (the bounded
    channel); the rollout loads a new version at the start of its next ``generate`` call, so a
    weight swap never pauses generation for longer than the load.

    With ``partial_rollout="restart"``, :meth:`fill` first cancels every generation that is
    still running with weights older than the newest and submits it again with the newest.

    Args:
        stages: the step's stages whose rollout group, weights (``version``) and task are used; it
            must offer ``job.stage(component)`` and ``submit_generation(step, expect)``.
        max_staleness: ``k >= 1``.
        partial_rollout: ``finish``, ``restart``, ``continue`` or ``carry``
            (``trainer.partial_rollout``).
        carry_surplus: ``carry``: steps of prompt groups the rollout's buffer holds beyond the
            step a call hands on (``trainer.carry_surplus``; primed before the first call).
        carry_segment: ``carry``: the rollout buffer's segment (None: the rollout's config).

    Raises:
        ConfigError: for a ``partial_rollout`` outside :data:`PARTIAL_ROLLOUTS`.
    """

    def __init__(
        self,
        stages: Generator,
        max_staleness: int,
        partial_rollout: str = "finish",
        carry_surplus: int = 1,
        carry_segment: int | None = None,
    ) -> None:
        if partial_rollout not in PARTIAL_ROLLOUTS:
            raise ConfigError(
                f"trainer.partial_rollout={partial_rollout!r} is not valid: choose one of "
                f"{list(PARTIAL_ROLLOUTS)}"
            )
        self.stages, self.k = stages, max_staleness
        self.policy = partial_rollout
        self.restart = partial_rollout == "restart"
        self.resume = partial_rollout == "continue"
        # carry: one generation ahead (a carried row spends the other k - 1 versions)
        self.ahead = 1 if partial_rollout == "carry" else max_staleness
        self.surplus, self.segment = max(int(carry_surplus), 1), carry_segment
        self._primed = False
        self.queue: deque[InFlight] = deque()
        self.next_step = 0
        self.horizon: int | None = None
        self.restarts_total = 0  # generations cancelled and submitted again, whole run
        self._restarts_at_fill = 0  # ... at the latest fill (the step's ``rollout/restarts``)
        self.dropped_total = 0  # samples dropped for staleness past the bound, whole run
        self._dropped_at_take = 0

    def reset(self, step: int, horizon: int | None = None) -> None:
        """Forget generations in flight; the next one submitted is for ``step``.

        Generations still running are cancelled (their results would never be read).

        Args:
            step: the next step to generate for.
            horizon: no generation is submitted for this step or later (``None``: no limit).
        """
        for g in self.queue:
            if not g.future.done():
                _cancel(g.future)
        self.queue.clear()
        self.next_step, self.horizon = step, horizon
        self._primed = False  # carry: the rollout starts a new buffer

    def fill(self, step: int) -> None:
        """Submit the generations of steps up to ``step + k`` not yet in flight.

        With ``restart``, generations still running with older weights than the stages'
        newest are cancelled and submitted again first (in step order: the rollout runs its
        calls in the order they arrive).
        """
        self._restarts_at_fill = self._swap_stale() if self.restart or self.resume else 0
        if not self.queue:
            self.next_step = max(self.next_step, step)
            if self.policy == "carry" and not self._primed:
                self._prime(self.next_step)
        ahead = step + self.ahead
        last = ahead if self.horizon is None else min(ahead, self.horizon - 1)
        while self.next_step <= last:
            self.queue.append(self._submit(self.next_step))
            self.next_step += 1

    def take(self, step: int) -> InFlight:
        """The generation of ``step`` (submitted by :meth:`fill`).

        Raises:
            WorkerError: the schedule lost its order (a step was skipped).
        """
        if not self.queue or self.queue[0].step != step:
            raise WorkerError(
                f"rollout pipeline holds steps {[g.step for g in self.queue]} but step {step} "
                f"trains next: call train_step with consecutive steps"
            )
        gen = self.queue.popleft()
        self._dropped_at_take = 0
        if over_bound(step, gen.first_version, self.k):  # the strict bound: never train it
            if not gen.future.done():
                _cancel(gen.future)
            self._dropped_at_take = self.stages.sizes.samples_per_step
            self.dropped_total += self._dropped_at_take
            gen = self._submit(step)
        return gen

    def metrics(self, gen: InFlight) -> dict[str, Any]:
        """The step record's ``rollout/*`` entries for the batch ``gen`` (taken this step).

        Returns:
            ``rollout/weight_version`` (the version the step's generation was first submitted
            with; the token versions give ``rollout/oldest_version``), ``rollout/staleness``
            (``step`` minus it) and ``rollout/staleness_max`` (the most versions any trained
            sample spans: the same, one version per batch),
            ``rollout/dropped_samples`` (samples past the bound, generated again); with ``restart``,
            ``rollout/restarts`` (generations restarted at this step's weight swap); with
            ``continue``, ``rollout/continued`` (generations paused and continued at it) and
            ``rollout/newest_version`` (the version of the generation's last pass).
        """
        stale = staleness(gen.step, gen.first_version)
        out: dict[str, Any] = {
            "rollout/weight_version": gen.first_version,
            "rollout/staleness": stale,
            "rollout/staleness_max": stale,  # a step's samples all started with one version
            "rollout/dropped_samples": self._dropped_at_take,
        }
        if self.restart:
            out["rollout/restarts"] = self._restarts_at_fill
        if self.resume:
            out["rollout/continued"] = self._restarts_at_fill
            out["rollout/newest_version"] = gen.version
        return out

    def drain(self) -> None:
        """Wait for every generation in flight; they stay queued for their steps (benchmarks:
        a timed section ends with the rollout idle, so it cannot delay the next section)."""
        for g in self.queue:
            g.future.wait()

    # ------------------------------------------------------------------------------ helpers
    def _submit(self, step: int, restarts: int = 0) -> InFlight:
        r = self.stages
        extra = self._carry_args(step) if self.policy == "carry" else {}
        with r.job.stage("rollout"):
            future = r.submit_generation(step, self._expect(step), policy=self.policy, **extra)
        return InFlight(step, r.version, future, restarts)

    def _carry_args(self, step: int) -> dict[str, Any]:
        """``carry``: the bound the rollout drops carried groups by, the deadline of the groups
        the next call would drop (finished in this one), and the prompts sampled: the next
        ``surplus`` steps ahead, since the rank's buffer holds that many steps' groups beyond
        the one it hands on (:meth:`_prime`)."""
        return {
            "oldest_version": max(step - self.k, 0),
            "due_version": max(step + 1 - self.k, 0),
            "data_step": step + self.surplus,
        }

    def _prime(self, step: int) -> None:
        """``carry``: before the first generation, the rollout samples the prompts of steps
        ``step .. step + surplus - 1`` into a new buffer without handing anything on (one call
        each, numbered ``step - surplus ..``: each draws its own seed), so each call has more
        groups than it hands on and the unfinished ones can be carried."""
        r = self.stages
        for j in range(self.surplus):
            with r.job.stage("rollout"):
                r.submit_generation(  # type: ignore[call-arg]
                    step - self.surplus + j,
                    self._expect(step),
                    policy=self.policy,
                    data_step=step + j,
                    hand_on=False,
                    extend=j > 0,
                    segment=self.segment,
                ).wait()
        self._primed = True

    def _expect(self, step: int) -> int:
        """The oldest version the rollout may sample step ``step``'s generation with."""
        return max(step - self.ahead, 0)

    def _continue(self, g: InFlight) -> InFlight:
        """Resubmit a paused generation: the rollout continues its rows with the new weights."""
        r = self.stages
        with r.job.stage("rollout"):
            future = r.submit_generation(
                g.step, self._expect(g.step), resume=True, policy=self.policy
            )
        return InFlight(g.step, r.version, future, g.restarts, g.first_version, g.continues + 1)

    def _swap_stale(self) -> int:
        """Cancel the generations running with old weights and submit each again: afresh
        (``restart``) or continuing where it stopped (``continue``); returns how many."""
        newest = self.stages.version
        stale = [g.version < newest and not g.future.done() for g in self.queue]
        if not any(stale):
            return 0
        for g, old in zip(self.queue, stale, strict=True):
            if old:
                _cancel(g.future)
        again = self._continue if self.resume else lambda g: self._submit(g.step, g.restarts + 1)
        self.queue = deque(again(g) if old else g for g, old in zip(self.queue, stale, strict=True))
        n = sum(stale)
        self.restarts_total += n
        return n


def _cancel(future: Any) -> None:
    """Cancel a group call on every rank.

    A running ``RolloutWorker.generate`` sees the flag at its next decoding step (or within
    10 ms of its modelled latency) and returns ``None``. A call queued behind another on the
    same actor is flagged when Ray retries the cancellation (about every 2 s), so with
    ``k >= 2`` a restarted generation that had not started yet may still run for that long.
    """
    refs = future.refs
    if not refs:
        return
    import ray

    for ref in refs:
        ray.cancel(ref)
