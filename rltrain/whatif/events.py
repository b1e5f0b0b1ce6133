"""The schedules of a step, as events in time: who works on which device, when.

Each schedule mirrors one of :mod:`rltrain.runners.schedules` (and the embodied pipeline of
:mod:`rltrain.runners.embodied`), stage for stage and in the same order, and records the spans a
real run records (same names, components, device and process lanes), so a prediction is a
timeline like a measured one:

- :func:`fused_step`: every rank generates, scores and trains in one call; the update waits for
  the slowest rank (its all-reduce).
- :func:`turn_step`: the rollout generates (loading new weights first, taking its turn on shared
  devices: offload and reload), then reward, log-probs, the update, the weight export.
- :class:`Pipeline`: ``trainer.max_staleness = k``: the generations of the next ``k`` steps run
  on the rollout while the actor learns; what happens to one still running when new weights
  arrive is the partial-rollout policy (:data:`POLICIES`). :class:`PoolPipeline`
  (``trainer.sampler=fifo|windowed``) trains the freshest pooled shards instead;
  :class:`CarryPipeline` (``partial_rollout=carry``) carries rows across calls.
- :func:`embodied_step`: env processes and rollout ranks pass pipeline items (a stage of
  environments) back and forth, then the PPO update.

Times are seconds from the simulation's start; spans are
:class:`~rltrain.telemetry.trace.Span` records in microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rltrain.kinds import registry
from rltrain.telemetry.trace import Span
from rltrain.whatif.samplers import Pooled, age_limit, choose
from rltrain.whatif.slots import DEFAULT_SEGMENT, CarryBuffer
from rltrain.whatif.workload import Proc, StepModel


class Sink:
    """Collects spans and per-step stage times."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.step_starts: list[float] = []
        self.stage_s: list[dict[str, float]] = []
        self.tokens: list[float] = []

    def add(self, name: str, proc: Proc | None, start: float, dur: float, lane: str = "") -> None:
        if dur <= 0:
            return
        comp = proc.component if proc is not None else "driver"
        devices = proc.devices if proc is not None else ()
        lane = lane or (proc.lane if proc is not None else "driver")
        # Rounded to 0.1 us at both ends, so that back-to-back spans touch exactly (sums of
        # floats would otherwise overlap by a hair and draw on two rows).
        a, b = round(start * 1e6, 1), round((start + dur) * 1e6, 1)
        self.spans.append(Span(name, comp, devices, lane, a, b - a, 0))

    def stage(self, name: str, seconds: float) -> None:
        self.stage_s[-1][name] = self.stage_s[-1].get(name, 0.0) + seconds

    def begin(self, t: float) -> None:
        self.step_starts.append(t)
        self.stage_s.append({})
        self.tokens.append(0.0)


def _all(m: StepModel, comp: str) -> tuple[Proc, ...]:
    return tuple(m.procs.get(comp, ()))


def _parallel(sink: Sink, m: StepModel, comp: str, name: str, t: float, dur: float) -> float:
    """Every process of ``comp`` does ``dur`` from ``t``; returns the end."""
    for p in _all(m, comp):
        sink.add(name, p, t, dur)
    return t + dur


def fused_step(m: StepModel, step: int, t: float, sink: Sink) -> float:
    """One fused step from ``t``; returns when the next one starts."""
    sink.begin(t)
    c = m.calib
    ranks = _all(m, "actor")
    world = len(ranks)
    start = t + c.call_s
    ends = []
    reward = m.reward() if m.sim else m.reward() / max(world, 1)
    gens = []
    for p, (g, tokens, _) in zip(ranks, m.generate_all(step, world), strict=True):
        sink.add("generate", p, start, g)
        sink.add("reward", p, start + g, reward)
        sink.tokens[-1] += tokens
        gens.append(g)
        ends.append(start + g + reward)
    train_start = max(ends)
    train = m.train("actor")
    for p in ranks:
        sink.add("train", p, train_start, train)
    end = train_start + train + c.call_s
    sink.add("step", None, t, end - t)
    sink.stage("step", end - t)
    sink.stage("generate", max(gens))
    sink.stage("reward", reward)
    sink.stage("train", train)
    return end + c.fused_overhead_s


def _learn(m: StepModel, t: float, sink: Sink) -> float:
    """The stages after generation (``ReasoningStages.learn``): reward, log-probs, the critic,
    the update, the weight export; returns the end."""
    c = m.calib
    for comp, name in (("reward", "reward"),):
        if comp in m.procs:
            r = m.reward()
            t = _parallel(sink, m, comp, name, t + c.call_s, r)
            sink.stage("reward", r + c.call_s)
    for comp, name in (("reference", "reference"), ("inference", "inference")):
        if comp in m.procs and (comp != "reference" or m.run.algorithm.kl_coef > 0):
            d = m.logprob(comp)
            t = _parallel(sink, m, comp, name, t + c.call_s, d)
            sink.stage("logprob", d + c.call_s)
    if "critic" in m.procs:
        d = m.train("critic")
        t = _parallel(sink, m, "critic", "train", t + c.call_s, d)
        sink.stage("critic", d + c.call_s)
    rel = m.move("actor")
    if rel:  # the actor's turn: it comes back (the rollout left after generating)
        t = _parallel(sink, m, "actor", "reload", t, rel)
        sink.stage("moves", rel)
    d = m.train("actor")
    t = _parallel(sink, m, "actor", "train", t + c.call_s, d)
    sink.stage("train", d + c.call_s)
    t = _export(sink, m, t)
    off = m.move("actor")
    if off:  # and leaves again once its weights are out
        t = _parallel(sink, m, "actor", "offload", t, off)
        sink.stage("moves", off)
    return t + c.call_s


def _export(sink: Sink, m: StepModel, t: float) -> float:
    """The actor's half of the weight sync: rank 0 packs and hands over the new weights (the
    rollout loads them at its next generate)."""
    s = m.sync() / 2
    ranks = _all(m, "actor")
    if ranks:
        sink.add("sync", ranks[0], t, s)
    sink.stage("sync", s)
    return t + s


def _generate(
    m: StepModel, step: int, t: float, sink: Sink, load: bool, moves: bool = True
) -> tuple[float, list[float]]:
    """The rollout's generate call from ``t`` on every rank: (end, per-rank ends). The
    rollout's reload, weight load and offload are drawn here and staged by the caller inside
    ``generate`` (as a generate timer that includes the switch measures them), not as
    ``moves``."""
    c = m.calib
    start = t + c.call_s
    rel = m.move("rollout") if moves else 0.0
    if rel:  # the rollout's turn: it comes back (the actor left after its update)
        start = _parallel(sink, m, "rollout", "reload", start, rel)
    load_s = m.sync() / 2 if load else 0.0
    ranks = _all(m, "rollout")
    ends = []
    for p, (g, tokens, _) in zip(ranks, m.generate_all(step, len(ranks)), strict=True):
        sink.add("sync", p, start, load_s)
        sink.add("generate", p, start + load_s, g)
        sink.tokens[-1] += tokens
        ends.append(start + load_s + g)
    end = max(ends, default=start)
    off = m.move("rollout") if moves else 0.0
    if off:  # and leaves once it has generated
        end = _parallel(sink, m, "rollout", "offload", end, off)
    return end, ends


def turn_step(m: StepModel, step: int, t: float, sink: Sink) -> float:
    """One synchronous step from ``t`` (``TurnSchedule``); returns when the next starts."""
    sink.begin(t)
    end, _ = _generate(m, step, t, sink, load=step > 0)
    end += m.calib.call_s
    sink.add("generate", None, t, end - t)
    sink.stage("generate", end - t)
    t = _learn(m, end, sink)
    return t + m.calib.overhead_s


# ------------------------------------------------------------------------------- pipelined
@dataclass
class Job:
    """A generation submitted ahead: its step, weight version and per-rank (start, end)."""

    step: int
    version: int
    work: list[tuple[float, float]] = field(default_factory=list)

    @property
    def end(self) -> float:
        return max((e for _, e in self.work), default=0.0)


#: ``trainer.partial_rollout`` -> whether a generation still running at a weight swap is
#: stopped there: ``(job, now) -> True`` to stop it; :data:`KEEPS_TOKENS` says what happens next.
POLICIES: dict[str, Callable[[Job, float], bool]] = {
    "finish": lambda job, now: False,
    "restart": lambda job, now: job.end > now,
    "continue": lambda job, now: job.end > now,
}
#: Policies whose stopped generation keeps the tokens made so far: the rank loads the new
#: weights, prefills each unfinished response's prefix again and decodes only what is left
#: (``restart`` throws the work away and generates the whole step again).
KEEPS_TOKENS = frozenset({"continue"})


#: A span held until its generation is read: (process, name, start, seconds).
Pending = tuple[Proc, str, float, float]


class Pipeline:
    """``PipelinedSchedule``: bounded staleness ``k`` over per-rank rollout queues.

    Args:
        m: the step model.
        k: ``trainer.max_staleness``.
        policy: ``trainer.partial_rollout``.
        sink: where spans go.
    """

    def __init__(self, m: StepModel, k: int, policy: str, sink: Sink) -> None:
        self.m, self.k, self.sink = m, k, sink
        self.cancel = POLICIES[policy]
        self.keeps = policy in KEEPS_TOKENS
        self.ranks = _all(m, "rollout")
        self.free = [0.0] * len(self.ranks)
        self.loaded = [0] * len(self.ranks)
        self.queue: list[Job] = []
        self.version = 0
        self.next_step = 0
        self.pending: dict[int, list[Pending]] = {}

    def _submit(self, step: int, t: float) -> Job:
        m = self.m
        job = Job(step, self.version)
        spans: list[Pending] = []
        gens = m.generate_all(step, len(self.ranks))
        for i in range(len(self.ranks)):
            self._call(i, t, gens[i][0], job, spans)
        self.pending[step] = spans
        return job

    def _call(
        self,
        i: int,
        t: float,
        seconds: float,
        job: Job,
        spans: list[Pending],
    ) -> None:
        """Rank ``i``'s generate call sent at ``t``: it starts behind the rank's queue, loads
        newer weights first, then generates for ``seconds``."""
        m, p = self.m, self.ranks[i]
        start = max(self.free[i], t + m.calib.call_s)
        load = m.sync() / 2 if self.version > self.loaded[i] else 0.0
        spans.append((p, "sync", start, load))
        spans.append((p, "generate", start + load, seconds))
        self.free[i] = start + load + seconds
        self.loaded[i] = self.version
        job.work.append((start, self.free[i]))

    def fill(self, step: int, t: float, horizon: int) -> None:
        """Restart what the policy cancels, then submit up to ``step + k``."""
        self._swap_stale(t)
        last = min(step + self.k, horizon - 1)
        self.next_step = max(self.next_step, step)
        while self.next_step <= last:
            self.queue.append(self._submit(self.next_step, t))
            self.next_step += 1

    def _swap_stale(self, t: float) -> None:
        """Generations running with old weights that the policy stops: submitted again whole,
        or continued (:data:`KEEPS_TOKENS`)."""
        stale = [j for j in self.queue if j.version < self.version and self.cancel(j, t)]
        if stale:
            for i in range(len(self.ranks)):
                self.free[i] = t
            left = {j.step: self._stop(j, t) for j in stale}
            self.queue = [
                (self._resume(j.step, t, left[j.step]) if self.keeps else self._submit(j.step, t))
                if j in stale
                else j
                for j in self.queue
            ]

    def _stop(self, job: Job, t: float) -> list[tuple[float, float]]:
        """Cut a generation's spans at ``t`` (the work before stays drawn); returns each rank's
        ``(seconds of its call done, the call's seconds)``."""
        spans = self.pending[job.step]
        done = [(min(max(t - a, 0.0), d), d) for _, n, a, d in spans if n == "generate"]
        self.pending[job.step] = [(p, n, a, min(d, max(t - a, 0.0))) for p, n, a, d in spans]
        self._flush(job.step)
        return done

    def _resume(self, step: int, t: float, done: list[tuple[float, float]]) -> Job:
        """A stopped generation continued with the newest weights: per rank, load them, then
        a new call prefills the unfinished responses' prefixes and decodes what is left."""
        m = self.m
        job = Job(step, self.version)
        spans: list[Pending] = []
        for i in range(len(self.ranks)):
            ran, full = done[i]
            if ran <= 0:  # not started yet: it simply starts with the newest weights
                d = full
            else:
                d = m.continue_generate(full, ran, len(self.ranks)) if ran < full else 0.0
            self._call(i, t, d, job, spans)
        self.pending[step] = spans
        return job

    def _flush(self, step: int) -> None:
        for p, name, a, d in self.pending.pop(step, []):
            self.sink.add(name, p, a, d)

    def step(self, step: int, t: float, horizon: int) -> float:
        """One step from ``t``; returns when the next starts."""
        self.sink.begin(t)
        self.fill(step, t, horizon)
        job = self.queue.pop(0)
        self._flush(job.step)
        return self._learn(step, t, max(t, job.end))

    def _learn(self, step: int, t: float, ready: float) -> float:
        """The driver waited from ``t`` until its batch was ready; the step learns and the
        version moves on. Returns when the next step starts."""
        m, sink = self.m, self.sink
        end = ready + m.calib.call_s
        sink.tokens[-1] += m.rows * m.lengths.mean()
        sink.add("generate_wait", None, t, end - t)
        sink.stage("generate", end - t)
        t = _learn(m, end, sink)
        self.version = step + 1
        return t + m.calib.overhead_s

    def close(self) -> None:
        for j in self.queue:
            self._flush(j.step)


class PoolPipeline(Pipeline):
    """``trainer.sampler=fifo|windowed`` (``PooledPipeline``): generation runs ahead of the
    steps, ``k + 1`` generations in flight while the steps left need more; a generation's rank
    shards are pooled once every rank completed it, and step ``s`` trains the freshest shards
    young enough (:func:`rltrain.whatif.samplers.choose`, the runtime's own choice), dropping
    the aged ones and waiting for the oldest generation in flight while too few qualify.

    Args:
        m: the step model.
        k: ``trainer.max_staleness``.
        policy: ``trainer.partial_rollout``.
        sink: where spans go.
        limit: the largest staleness a shard trains with
            (:func:`~rltrain.whatif.samplers.age_limit`).
    """

    def __init__(self, m: StepModel, k: int, policy: str, sink: Sink, limit: int) -> None:
        super().__init__(m, k, policy, sink)
        self.limit = limit
        self.want = max(len(self.ranks), 1)
        self.pool: list[Pooled] = []
        self.dropped = 0  # shards dropped past the limit, whole simulation

    def fill(self, step: int, t: float, horizon: int) -> None:
        self._swap_stale(t)
        self._harvest(t)
        while len(self.queue) < self.k + 1 and self._short(step, horizon):
            self._submit_next(t)

    def step(self, step: int, t: float, horizon: int) -> float:
        self.sink.begin(t)
        self.fill(step, t, horizon)
        now = t
        while True:
            self._harvest(now)
            choice = choose(self.pool, step, self.want, self.limit)
            self.dropped += len(choice.drop)
            self.pool = [p for p in self.pool if p not in choice.drop]
            if choice.train:
                break
            if not self.queue:  # every generation in flight was too old: generate afresh
                self._submit_next(now)
            now = max(now, self.queue[0].end)  # wait for the oldest in flight
        self.pool = [p for p in self.pool if p not in choice.train]
        return self._learn(step, t, now)

    def _submit_next(self, t: float) -> None:
        self.queue.append(self._submit(self.next_step, t))
        self.next_step += 1

    def _short(self, step: int, horizon: int) -> bool:
        have = len(self.pool) + len(self.queue) * self.want
        return have < (horizon - step) * self.want

    def _harvest(self, now: float) -> None:
        """Pool the shards of the generations every rank completed by ``now``."""
        for job in [j for j in self.queue if j.end <= now]:
            self.queue.remove(job)
            self._flush(job.step)
            self.pool += [Pooled(job.step, r, job.version, job.version) for r in range(self.want)]


class CarryPipeline(Pipeline):
    """``trainer.partial_rollout=carry``: each rollout rank keeps a
    :class:`~rltrain.whatif.slots.CarryBuffer` across its calls, the very buffer the rollout
    worker runs (``RolloutWorker._carried``), fed the same lengths.

    As the runtime does (``GenerationPipeline`` with ``carry``): before the first step every
    rank samples ``trainer.carry_surplus`` steps' groups into its buffer (one call each) and
    hands nothing on; then the pipeline runs
    one generation ahead, and the call for step ``s`` drops the groups started before version
    ``s - k`` (sampling their prompts again with the weights it holds), samples the next step's
    groups, and decodes segments until it has as many complete groups as it hands on and every
    group the next call would drop is complete (the deadline). Its
    lengths are those the rollout draws: the call for step ``s`` on rank ``r`` draws with the
    seed of ``(s, r)``, a group sampled again with its continuation seed.

    A call's device time is the buffer's decoding steps: ``simulate.rollout_token_latency_ms``
    each on simulated devices (plus ``rollout_latency_ms`` per call and the host sampling the
    new rows whole), else the roofline's decoding step at the call's mean busy slots and a
    prefill of the rows admitted.

    Args:
        m: the step model.
        k: ``trainer.max_staleness`` (``>= 2``), the bound the buffer drops groups by.
        sink: where spans go.
    """

    def __init__(self, m: StepModel, k: int, sink: Sink) -> None:
        super().__init__(m, 1, "finish", sink)  # one generation ahead; nothing is cancelled
        run = m.run
        self.bound = k
        self.n = max(int(run.rollout.n_samples_per_prompt), 1)
        rows = m.rows_per("rollout")
        self.want = max(rows // self.n, 1)
        segment = int(run.trainer.carry_segment or DEFAULT_SEGMENT)
        slots = rows if m.sim else max(min(rows, m.concurrency()), 1)
        self.buffers = [CarryBuffer(slots, segment) for _ in self.ranks]
        self.surplus = max(int(run.trainer.carry_surplus or 1), 1)
        self.primed = False
        self._keys = 0

    def fill(self, step: int, t: float, horizon: int) -> None:
        if not self.primed:
            self._prime(step, t)
        super().fill(step, t, horizon)

    def _prime(self, step: int, t: float) -> None:
        """Every rank samples ``surplus`` steps' groups into its buffer, handing nothing on:
        one call each, numbered ``step - surplus ..`` (each draws its own lengths), the driver
        waiting for each, as the runtime's prime calls."""
        c, world = self.m.calib, len(self.ranks)
        for j in range(self.surplus):
            end = t
            for i, p in enumerate(self.ranks):
                lens = self.m.draw_lengths(step - self.surplus + j, i, world)
                self._admit(i, lens, self.version)
                host = self.m.carry_sampling(lens, world)
                start = max(self.free[i], t + c.call_s)
                self.sink.add("generate", p, start, host)
                self.free[i] = start + host
                end = max(end, self.free[i])
            t = end
        self.primed = True

    def _admit(self, rank: int, lens: Sequence[int], version: int) -> None:
        for first in range(0, len(lens), self.n):
            self.buffers[rank].admit(self._keys, version, lens[first : first + self.n])
            self._keys += 1

    def _submit(self, step: int, t: float) -> Job:
        m = self.m
        world = len(self.ranks)
        job = Job(step, self.version)
        spans: list[Pending] = []
        oldest = max(step - self.bound, 0)
        for i in range(len(self.ranks)):
            buf = self.buffers[i]
            again = len(buf.run(0, oldest).dropped) * self.n  # past the bound: sampled again
            redo = m.redraw_lengths(step, i, self.version, again)
            fresh = m.draw_lengths(step, i, world)
            self._admit(i, redo, self.version)
            self._admit(i, fresh, self.version)
            versions = {key: g.version for key, g in buf.groups.items()}
            done = buf.run(self.want, oldest, due=max(step + 1 - self.bound, 0))
            job.version = min((versions[key] for key in done.ready), default=self.version)
            self._call(i, t, m.carry_call(done, redo, fresh, world), job, spans)
        self.pending[step] = spans
        return job


# -------------------------------------------------------------------------------- embodied
def embodied_step(m: StepModel, step: int, t: float, sink: Sink) -> float:
    """One embodied step: the pipelined rollout epoch, then the PPO update and the sync."""
    sink.begin(t)
    env = m.run.env
    envs = _all(m, "env") or (Proc("env", 0, (), 0),)
    ranks = _all(m, "rollout")
    stages, steps = max(env.pipeline_stage_num, 1), env.rollout_steps
    per = env.num_envs / (len(envs) * stages)
    e_item, i_item = m.env_item(per), m.infer_item(per)
    start = t + m.calib.call_s + m.calib.epoch_extra_s / 2
    rel = m.move("rollout")
    if rel:  # the epoch's turn: the rollout comes back (staged inside generate, below)
        start = _parallel(sink, m, "rollout", "reload", start, rel)
    load = m.sync() / 2 if step > 0 else 0.0  # the rollout loads the newest weights first
    for p in ranks:
        sink.add("sync", p, start, load)
    env_free = [start] * len(envs)
    roll_free = [start + load] * len(ranks)
    ready = [[start] * stages for _ in envs]  # each stage's observations (reset: at once)
    for _ in range(steps):
        for j in range(stages):
            for e, proc in enumerate(envs):
                q = (e * stages + j) % max(len(ranks), 1)
                a = max(roll_free[q], ready[e][j])  # the rollout infers the stage's actions
                sink.add("generate", ranks[q], a, i_item)
                roll_free[q] = a + i_item
                b = max(env_free[e], roll_free[q])  # then its env process steps it
                sink.add("env_step", proc, b, e_item)
                env_free[e] = b + e_item
                ready[e][j] = env_free[e]
    end = max(max(env_free), max(roll_free))
    end += m.calib.epoch_extra_s / 2 + m.calib.call_s
    sink.tokens[-1] += env.num_envs * steps
    sink.add("generate", None, t, end - t)
    sink.stage("generate", end - t)
    off, rel = m.move("rollout"), m.move("actor")
    if off or rel:  # the update's turn: the rollout leaves, the actor comes back
        _parallel(sink, m, "rollout", "offload", end, off)
        end = _parallel(sink, m, "actor", "reload", end + off, rel)
        sink.stage("moves", off + rel)
    d = m.train("actor")
    t = _parallel(sink, m, "actor", "train", end + m.calib.call_s, d)
    sink.stage("train", d + m.calib.call_s)
    t = _export(sink, m, t)  # the rollout's load opened this epoch: inside generate
    off = m.move("actor")
    if off:  # the actor leaves once its weights are out
        t = _parallel(sink, m, "actor", "offload", t, off)
        sink.stage("moves", off)
    return t + m.calib.call_s + m.calib.overhead_s


def simulate(
    m: StepModel,
    steps: int,
    schedule: str,
    staleness: int = 0,
    policy: str = "finish",
    sampler: str = "in_order",
) -> Sink:
    """Run ``steps`` steps of a schedule.

    Args:
        m: the step model.
        steps: steps to simulate.
        schedule: ``fused``, ``turns``, ``pipelined`` or ``embodied``.
        staleness: ``k`` of the pipelined schedule.
        policy: ``trainer.partial_rollout`` of the pipelined schedule.
        sampler: ``trainer.sampler`` of the pipelined schedule (``fifo`` and ``windowed``:
            :class:`PoolPipeline`, with ``trainer.sampler_window`` from ``m.run``).

    Returns:
        The sink: spans, step starts, per-step stage times and tokens. The end of the last step
        is appended to ``step_starts``.
    """
    sink = Sink()
    t = 0.0
    if schedule == "pipelined":
        k = max(staleness, 1)
        pipe: Pipeline
        if policy == "carry":
            pipe = CarryPipeline(m, max(staleness, 2), sink)
        elif sampler != "in_order":
            limit = age_limit(sampler, k, m.run.trainer.sampler_window)
            pipe = PoolPipeline(m, k, policy, sink, limit)
        else:
            pipe = Pipeline(m, k, policy, sink)
        for s in range(steps):
            t = pipe.step(s, t, steps)
        pipe.close()
    else:
        fn = {"fused": fused_step, "turns": turn_step, "embodied": embodied_step}[schedule]
        for s in range(steps):
            t = fn(m, s, t, sink)
    sink.step_starts.append(t)
    return sink


def schedule_of(run: Any, fused: bool) -> tuple[str, int, str]:
    """``(schedule, staleness, policy)`` the run's layout calls for (as
    :func:`rltrain.runners.schedules.schedule_for` decides)."""
    if registry.runner(run).steps_env:
        return "embodied", 0, "finish"
    if fused:
        return "fused", 0, "finish"
    k = int(run.trainer.max_staleness)
    if k > 0:
        return "pipelined", k, str(run.trainer.partial_rollout)
    return "turns", 0, "finish"


def unmodelled(run: Any) -> list[str]:
    """Settings of the run that change its schedule but that the simulator does not model, each
    with the fix (``mode=plan`` refuses them rather than predict another schedule).

    The simulator's pipelines run the runtime's own choices (the samplers' pool,
    :class:`PoolPipeline`; ``partial_rollout=carry``'s buffer, :class:`CarryPipeline`), but it
    draws each rank's response lengths independently, with no prompt whose past lengths a
    dispatcher could know. On simulated devices that is the run's own rule (their modelled
    lengths are drawn per step and rank, whatever prompts a rank gets, and a rank's call lasts
    its longest row), so ``rollout.dispatch=length_aware`` predicts as ``in_order``; on catalogue
    hardware (``whatif.hardware``) it is refused.

    Args:
        run: the checked run config.

    Returns:
        One line per unmodelled setting (empty: the prediction is of the run as configured).
    """
    out = []
    dispatch = str(run.rollout.dispatch)
    hardware = getattr(getattr(run, "whatif", None), "hardware", None)
    if dispatch != "in_order" and hardware:
        out.append(
            f"rollout.dispatch={dispatch!r} with whatif.hardware={hardware!r}: the what-if "
            f"simulator decodes a catalogue device's requests by continuous batching, where "
            f"packing prompts by their past lengths would matter, but it draws every rank's "
            f"response lengths independently, with no per-prompt lengths to pack by; plan with "
            f"rollout.dispatch=in_order"
        )
    return out


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs`` by linear interpolation."""
    s = sorted(xs)
    if not s:
        return math.nan
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
