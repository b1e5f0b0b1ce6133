"""What one step asks of each process: the plan and the config turned into stage durations.

:class:`StepModel` answers, for one step, how long each process's part takes on the chosen
hardware: a rollout rank's generation (its requests' lengths drawn from the length model), the
reward, log-prob passes, an actor rank's update, the weight sync, offload and reload. On a
simulated device a stage's device time is its ``simulate.*`` latency (as the workers sleep it)
plus the host work the calibration measured; on a catalogue device it is the roofline's
(:mod:`rltrain.whatif.roofline`). The schedules (:mod:`rltrain.whatif.events`) order the parts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import rltrain.whatif.lengths as lengths_mod
from rltrain.config.numerics import old_logprob_pass
from rltrain.config.seeds import continuation_seed, sampling_seed
from rltrain.placement import memory as mem
from rltrain.telemetry.trace import device_label
from rltrain.whatif.calibrate import DEFAULT, Calibration
from rltrain.whatif.hardware import HOST_MEMORY, SIM, Device, Link, link
from rltrain.whatif.roofline import (
    ModelCost,
    decode_step_seconds,
    forward_seconds,
    generate_seconds,
    prefill_seconds,
    train_seconds,
)

#: A rule reward's host time per scored response on a real cluster (string matching).
RULE_REWARD_S_PER_ROW = 2e-4
#: An embodied policy (a small MLP) per inference call on a real device: launch-bound.
POLICY_CALL_S = 3e-4


@dataclass(frozen=True)
class Proc:
    """One planned process: component, rank, device lanes (empty: a node-only process)."""

    component: str
    rank: int
    devices: tuple[str, ...]
    node: int

    @property
    def lane(self) -> str:
        return f"{self.component}[{self.rank}]"


@dataclass
class StepModel:
    """Stage durations of one step on one hardware (see the module docstring).

    Attributes:
        run: the run config.
        procs: component -> its processes in rank order.
        device: the hardware (``SIM`` for simulated devices).
        inter: the link between nodes.
        calib: rltrain's runtime terms.
        fused: actor, rollout and reward in one process per device.
        lengths: the response-length model.
        kv_tokens: KV-cache tokens one rollout process holds (from the plan).
        shares: actor and rollout share devices (they take turns).
        moved: component -> bytes it moves off (and back onto) a device per step where it
            takes turns (the plan's ``offloaded`` terms: ``after_stage`` always, ``on_demand``
            only where the device lacks the room).
        exact_ranks: simulate the decoding of only this many ranks per step (the ones holding
            the longest and the most tokens); the others take the shortest of those. None:
            every rank. A ranking needs only the slowest rank's time.
        transport: the rollout's weight-sync transport as the run resolves it (``host``,
            ``collective``, ``ipc``: :func:`sync_transport`); None: CUDA IPC where actor and
            rollout share devices, else a broadcast.
    """

    run: Any
    procs: Mapping[str, tuple[Proc, ...]]
    device: Device
    inter: Link
    calib: Calibration = DEFAULT
    fused: bool = False
    lengths: Any = None
    kv_tokens: int = 0
    shares: bool = False
    exact_ranks: int | None = None
    moved: Mapping[str, int] = field(default_factory=dict)
    transport: str | None = None
    cost: ModelCost = field(init=False)

    def __post_init__(self) -> None:
        self.dims = mem.model_dims(self.run.model)
        self.cost = ModelCost.of(self.dims)
        if self.lengths is None:
            self.lengths = lengths_mod.from_config(self.run)
        self.sim = self.device.simulated
        r = self.run
        self.rows = r.trainer.train_batch_size * r.rollout.n_samples_per_prompt
        self.prompt = int(r.task.max_prompt_length) if not self.sim else 0
        self.tp = max(int(r.rollout.tensor_parallel_size), 1)

    # --------------------------------------------------------------------------- sizes
    def world(self, component: str) -> int:
        return len(self.procs.get(component, ()))

    def rows_per(self, component: str) -> int:
        return math.ceil(self.rows / max(self.world(component), 1))

    def concurrency(self) -> int:
        """Sequences one rollout engine decodes at once: its KV cache over one sequence."""
        if self.kv_tokens <= 0:
            return self.rows_per("rollout")
        seq = self.prompt + self.lengths.mean()
        return max(1, int(self.kv_tokens // max(seq, 1)))

    def tokens(self) -> float:
        """Tokens of a step's batch (prompts and responses)."""
        return self.rows * (self.prompt + self.lengths.mean())

    # --------------------------------------------------------------------------- stages
    def generate_all(self, step: int, world: int) -> list[tuple[float, int, int]]:
        """Every rollout rank's generate call of ``step`` (see :meth:`generate`)."""
        if self.exact_ranks is None or world <= self.exact_ranks or self.sim:
            return [self.generate(step, r, world) for r in range(world)]
        drawn = [self.draw_lengths(step, r, world) for r in range(world)]
        k = max(self.exact_ranks // 2, 1)
        by_max = sorted(range(world), key=lambda r: -max(drawn[r], default=0))[:k]
        by_sum = sorted(range(world), key=lambda r: -sum(drawn[r]))[:k]
        exact = {r: self._generate(drawn[r], world) for r in {*by_max, *by_sum}}
        floor = min(exact.values())
        return [exact.get(r, (floor[0], sum(drawn[r]), floor[2])) for r in range(world)]

    def draw_lengths(self, step: int, rank: int, world: int) -> list[int]:
        """The response lengths of rank ``rank``'s generate call for ``step``, drawn as the
        rollout seeds its sampling (and the carry buffer its modelled lengths)."""
        rng = random.Random(sampling_seed(self.run.seed, step, rank))  # as the rollout seeds
        return self.lengths.sample(rng, math.ceil(self.rows / max(world, 1)))

    def generate(self, step: int, rank: int, world: int) -> tuple[float, int, int]:
        """A rollout rank's generate call: ``(seconds, response tokens, decoding steps)``.

        Lengths are drawn per (step, rank) as the worker seeds its sampling, so a restarted
        generation of the same step draws the same lengths.
        """
        return self._generate(self.draw_lengths(step, rank, world), world)

    def _generate(self, lens: list[int], world: int) -> tuple[float, int, int]:
        sim = self.run.simulate
        if self.sim:
            steps = max(lens) if lens else 0
            s = (sim.rollout_latency_ms + sim.rollout_token_latency_ms * steps) / 1000
            # the host decodes the real responses, at most the budget (modelled lengths,
            # simulate.response_length_median, may run past it)
            real = min(steps, int(self.run.rollout.max_new_tokens))
            host = self.calib.generate_extra(world) + self.calib.decode_step_s * real
            return s + host, sum(lens), steps
        s, steps = generate_seconds(
            self.device, self.cost, self.prompt, lens, self.concurrency(), self.tp
        )
        return s, sum(lens), steps

    def continue_generate(self, full_s: float, done_s: float, world: int) -> float:
        """A rank's generate call continuing a stopped one (``partial_rollout=continue``).

        On a simulated device a call decodes first and pays its fixed cost (latency and host
        work) last, as the rollout worker does: the new call decodes what the stopped one had
        left of its ``full_s - fixed`` seconds of decoding (nothing where the stop came in the
        fixed cost), then pays the fixed cost again. On a catalogue device: the prefill of the
        unfinished responses' prefixes (prompt plus the tokens made so far) and the decoding
        the stopped call had left.

        Args:
            full_s: the stopped call's seconds had it run to the end.
            done_s: its seconds run before it stopped.
            world: rollout ranks.

        Returns:
            The continuing call's seconds.
        """
        if self.sim:  # a call's latency (and host work) is paid again; decoded steps are kept
            fixed = self.run.simulate.rollout_latency_ms / 1000 + self.calib.generate_extra(world)
            return fixed + max(full_s - fixed - done_s, 0.0)
        share = min(done_s / full_s, 1.0) if full_s > 0 else 1.0
        in_flight = min(self.rows_per("rollout"), self.concurrency())
        prefix = in_flight * (self.prompt + share * self.lengths.mean())
        return prefill_seconds(self.device, self.cost, prefix, self.tp) + full_s - done_s

    def redraw_lengths(self, step: int, rank: int, version: int, rows: int) -> list[int]:
        """``carry``: the lengths of ``rows`` rows sampled again after the bound dropped their
        groups, drawn with the seed the rollout samples them with."""
        if rows <= 0:
            return []
        rng = random.Random(continuation_seed(self.run.seed, step, rank, version))
        return self.lengths.sample(rng, rows)

    def carry_sampling(self, lens: Sequence[int], world: int) -> float:
        """``carry`` on a simulated device: the host samples a call's new rows whole (the
        buffer decides when they complete); 0 on a catalogue device, whose decoding is the
        buffer's steps."""
        if not self.sim or not lens:
            return 0.0
        real = min(max(lens), int(self.run.rollout.max_new_tokens))
        return self.calib.generate_extra(world) + self.calib.decode_step_s * real

    def carry_call(self, done: Any, redo: Sequence[int], fresh: Sequence[int], world: int) -> float:
        """A rank's ``carry`` call: the segments its buffer decoded (``done``, a
        :class:`~rltrain.whatif.slots.Segmented`) plus sampling the rows it admitted (``redo``:
        groups the bound dropped, sampled again; ``fresh``: the next step's).

        Returns:
            Seconds: on a simulated device ``rollout_latency_ms`` and
            ``rollout_token_latency_ms`` per decoding step, plus the host's sampling; on a
            catalogue device each step at the call's mean busy slots plus a prefill of the rows
            admitted.
        """
        if self.sim:
            sim = self.run.simulate
            device = (sim.rollout_latency_ms + sim.rollout_token_latency_ms * done.steps) / 1000
            host = self.carry_sampling(redo, world) + self.carry_sampling(fresh, world)
            return device + host
        if done.steps <= 0:
            return 0.0
        batch = max(done.busy / done.steps, 1.0)
        context = self.prompt + self.lengths.mean() / 2
        step_s = decode_step_seconds(self.device, self.cost, int(round(batch)), context, self.tp)
        admitted = (len(redo) + len(fresh)) * self.prompt
        return done.steps * step_s + prefill_seconds(self.device, self.cost, admitted, self.tp)

    def reward(self) -> float:
        """Scoring a step's batch (rule reward; a reward model as a log-prob pass)."""
        if self.run.reward.kind == "model" and not self.sim:
            world = max(self.world("reward"), 1)
            return forward_seconds(self.device, self.cost, self.tokens() / world, self._u())
        if self.sim:
            return self.calib.reward_s
        return RULE_REWARD_S_PER_ROW * self.rows / max(self.world("reward"), 1)

    def logprob(self, component: str) -> float:
        """A reference or inference rank's log-prob pass over its share of the batch."""
        world = max(self.world(component), 1)
        if self.sim:
            return self.calib.call_s + self.calib.generate_extra(world) / 2
        return forward_seconds(self.device, self.cost, self.tokens() / world, self._u())

    def train(self, component: str = "actor") -> float:
        """An actor (or critic) rank's update on its share of the batch, with the actor's own
        pi_old forward pass where the run makes one (``algorithm.old_logprobs``)."""
        world = max(self.world(component), 1)
        epochs = int(self.run.algorithm.ppo_epochs)
        if self.sim:
            knob = self.run.simulate.actor_latency_ms / 1000 if component == "actor" else 0.0
            return knob + self.calib.train_extra(world)
        dp_link = self._dp_link(component)
        tokens = self.tokens() / world
        seconds = train_seconds(self.device, self.cost, tokens, self._u(), world, dp_link, epochs)
        if component == "actor" and old_logprob_pass(self.run):  # pi_old before the update
            seconds += forward_seconds(self.device, self.cost, tokens, self._u())
        return seconds

    def sync(self) -> float:
        """New weights from the actor to the rollout, over :attr:`transport`: CUDA IPC a
        device-local copy; ``collective`` a broadcast tree over the node's link (or the network
        between nodes); ``host`` (:meth:`host_sync`) through the host and Ray's object store."""
        if self.fused:
            return 0.0
        nbytes = self.cost.weight_bytes
        if self.sim:
            return self.calib.sync_s + HOST_SECONDS(nbytes)
        transport = self.transport or ("ipc" if self.shares else "collective")
        if transport == "none":  # no rollout to feed
            return 0.0
        if transport == "ipc":
            return nbytes / (self.device.bandwidth * 0.8)
        if transport == "host":
            return self.host_sync(nbytes)
        actor_nodes = {p.node for p in self.procs.get("actor", ())}
        roll_nodes = {p.node for p in self.procs.get("rollout", ())}
        lk = (
            self.device.intra if actor_nodes == roll_nodes and len(actor_nodes) == 1 else self.inter
        )
        return lk.seconds(nbytes, hops=max(1, math.ceil(math.log2(max(self.world("rollout"), 2)))))

    def host_sync(self, nbytes: float) -> float:
        """``weight_sync.transport=host`` on a catalogue device: actor rank 0 copies the weights
        to the CPU over its host link (PCIe), packs them into buckets Ray's object store holds
        (host memory, :data:`HOST_MEMORY`), the network carries them to a rollout on another
        node, and every rollout rank copies them onto its device over its own host link (in
        parallel)."""
        actor = self.procs.get("actor", ())
        source = actor[0].node if actor else 0
        remote = any(p.node != source for p in self.procs.get("rollout", ()))
        seconds = 2 * self.device.host.seconds(nbytes) + HOST_MEMORY.seconds(nbytes)
        return seconds + (self.inter.seconds(nbytes) if remote else 0.0)

    def move(self, component: str) -> float:
        """Seconds ``component`` spends offloading (or, the same again, reloading) per step."""
        nbytes = self.moved.get(component, 0) if not self.fused else 0
        if not nbytes:
            return 0.0
        fixed = self.calib.move_s if self.sim else 0.0
        return fixed + self.device.host.seconds(nbytes)

    def _u(self) -> float:
        w = getattr(self.run, "whatif", None)
        return float(getattr(w, "train_utilization", 0.4) if w is not None else 0.4)

    def _dp_link(self, component: str) -> Link:
        nodes = {p.node for p in self.procs.get(component, ())}
        return self.device.intra if len(nodes) <= 1 else self.inter

    # --------------------------------------------------------------------------- embodied
    def env_item(self, m: float) -> float:
        """An env process stepping one pipeline stage of ``m`` environments once."""
        sim = self.run.simulate
        knob = m * (sim.env_step_latency_ms + sim.env_step_jitter_ms / 2) / 1000
        return knob + self.calib.env_item_s + self.calib.env_per_env_s * m

    def infer_item(self, m: float) -> float:
        """A rollout rank inferring the actions of one stage's ``m`` observations."""
        sim = self.run.simulate
        if self.sim:
            knob = m * (sim.env_policy_latency_ms + sim.env_policy_jitter_ms / 2) / 1000
            return knob + self.calib.infer_item_s + self.calib.infer_per_env_s * m
        return POLICY_CALL_S + forward_seconds(self.device, self.cost, m, self._u())


def HOST_SECONDS(nbytes: float) -> float:  # noqa: N802 - a constant-like helper
    """Seconds to move ``nbytes`` through the host (object store) on simulated devices."""
    return SIM.host.seconds(nbytes, hops=0)


def sync_transport(run: Any, plan: Any) -> str:
    """The weight-sync transport the run would give its rollout on ``plan``'s devices, as the
    runtime resolves ``weight_sync.transport`` (``auto`` included:
    :func:`~rltrain.placement.transport_choice.choose_transport`).

    Args:
        run: the run config.
        plan: the plan the prediction times (on ``whatif.hardware``'s devices when set).

    Returns:
        ``host``, ``collective``, ``ipc`` or ``none``; an explicit transport these devices could
        not serve (the configured cluster's check accepted it) is timed as named.
    """
    from rltrain.errors import ConfigError
    from rltrain.placement.transport_choice import choose_transport

    try:
        return choose_transport(run, plan, "rollout").name
    except ConfigError:
        return str(run.weight_sync.transport)


def procs_of(plan: Any) -> dict[str, tuple[Proc, ...]]:
    """component -> its processes, from a :class:`~rltrain.placement.plan.Plan`."""
    out: dict[str, tuple[Proc, ...]] = {}
    for comp in plan.components:
        out[comp] = tuple(
            Proc(
                comp,
                p.rank,
                tuple(device_label(p.node_rank, d) for d in p.devices),
                p.node_rank,
            )
            for p in plan.by_component[comp]
        )
    return out


def moved_bytes(plan: Any) -> dict[str, int]:
    """component -> the most bytes of its state the plan has off a device in some stage
    (what it offloads and reloads each step), for actor and rollout."""
    out: dict[str, int] = {}
    for dm in {id(m): m for m in plan.memory.values()}.values():
        for stage in dm.stages:
            per: dict[str, int] = {}
            for t in stage.terms:
                if t.status == "offloaded" and t.component in ("actor", "rollout"):
                    per[t.component] = per.get(t.component, 0) + t.bytes
            for comp, b in per.items():
                out[comp] = max(out.get(comp, 0), b)
    return out


def kv_tokens(plan: Any, run: Any) -> int:
    """KV-cache tokens one rollout process holds, from the plan's memory prediction."""
    rollout = plan.by_component.get("rollout", ())
    if not rollout:
        return 0
    p = rollout[0]
    if not p.devices:
        return 0
    dm = plan.memory[(p.node_rank, p.devices[0])]
    kv = 0
    for stage in dm.stages:
        if stage.stage == "generate":
            kv = sum(
                t.bytes for t in stage.terms if t.component == "rollout" and t.kind == "kv_cache"
            )
    per_token = mem.kv_bytes_per_token(mem.model_dims(run.model))
    return int(kv * len(p.devices) // max(per_token, 1))


def inter_link(run: Any, device: Device) -> Link:
    """``whatif.link``, else InfiniBand for catalogue hardware, host memory when simulated."""
    if device.simulated:
        return device.intra
    name = getattr(getattr(run, "whatif", None), "link", None) or "infiniband"
    return link(name)
