"""The cost model: a candidate layout's seconds per training step, from a profile.

Every number below is measured by the profiling runs (:mod:`rltrain.autoplace.profile`); this
module only combines them, so it is pure arithmetic and tested with hand-computed values. The
model is documented with its measured error in ``docs/auto_placement.md``.

Per-stage time as a function of the devices ``k`` a stage gets: ``t(k) = fixed + parallel / k``
(:class:`Scaling`), fitted to the runs at 1, 2, ... devices. ``fixed`` is what more devices do
not shorten (a device's own latency per call, Ray round trips, the part of a batch one device
must do alone), ``parallel`` the work data parallelism divides.

Reasoning step (``G`` generate on the rollout's devices, ``R`` reward, ``T`` train on the
actor's devices, ``S`` weight sync, ``M`` offload/reload where actor and rollout share devices,
``O`` the driver's time between steps, ``O_f`` a fused step's call and driver time):

==============================  ===========================================================
collocated, fused               ``G(D) + R + T(D) + O_f`` (one process: no sync, no moves)
collocated, taking turns        ``G(D) + R + T(D) + S + M(D) + O`` (sequential sum)
hybrid (rollout on ``k``)       ``G(k) + R + T(D) + S + M(k) + O``
disaggregated, synchronous      ``G(k) + R + T(D-k) + S + O``
disaggregated, ``max_staleness=1``  ``max(G(k), R + T(D-k) + S + O)`` (both sides at once)
==============================  ===========================================================

An asynchronous candidate's ``trainer.partial_rollout`` matters only where a generation is
still running when the actor publishes new weights, i.e. ``G > A`` with ``A = R + T + S + O``
(the actor's part). Then ``finish`` is the row above (``G``), ``restart`` is ``G + A`` (the
generation is cancelled at the swap and run again from its start) and ``continue`` is
``max(G, A + F)``. A call decodes first and pays its fixed cost ``F`` (the generation's
``fixed`` seconds: the profile has no prefill figure of its own) at its end; it is stopped
``A`` into its run and the resumed call decodes what is left, ``max(G - F - A, 0)``, then pays
``F`` again: ``A + max(G - F - A, 0) + F``. Where the actor's part is shorter than the
decoding the step keeps ``G``; where the swap lands in the fixed cost, the first pass's ``F``
is lost and the step is ``A + F``. (``F`` is taken at most ``G``.) With ``G <= A`` all three
are ``A``. The model thus never ranks ``continue`` or ``restart`` faster than ``finish``: what
they buy is fresher samples (docs/async.md), not step time. ``carry`` (``max_staleness=2``) is
``max(b G, A)``: its calls keep the decoding slots busy across calls instead of waiting for
each batch's longest row, so a call takes a share ``b`` of a static batch's generation:
``b = steps / E[longest of the rows one rank decodes]``, where ``steps`` is a carry call's
decoding steps with the run's length model, the candidate's bound, ``trainer.carry_surplus``
and ``trainer.carry_segment``, from the rollout's own buffer run by arithmetic over a long run
(:func:`rltrain.whatif.slots.carry_share`). That includes the deadline: a call goes on until
every group the next call would drop is complete, so on heavy tails at ``max_staleness=2`` it
decodes about twice the mean length rather than the mean. ``b = 1`` where every response runs
to the budget, so ``carry`` then ranks as ``finish``.

``T`` includes the actor's pi_old forward pass where the profiled (synchronous) runs made one
(``algorithm.old_logprobs``: recomputed, more than one optimizer step per batch, no inference
component); a candidate with ``max_staleness=1`` that makes one where they did not adds its
seconds ``P(k)`` (measured as ``actor/old_logprobs_s`` when the profile ran the pass, else a
third of an epoch's training time: a forward pass without the backward).

Embodied step: a pipelined rollout epoch, then the update: ``P + E + T(k) + S + M + O`` where
``P`` is RLinf's pipeline formula ``T_critical + (N - 1) * T_bottleneck`` over the
``N = steps x S`` items an env process pushes through simulator and policy (see
:func:`pipeline_seconds`) and ``E`` the measured per-epoch cost beyond it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rltrain.autoplace.candidates import Candidate


def _line(
    points: Sequence[tuple[float, float]], rising_only: bool, pin: bool = True
) -> tuple[float | None, float]:
    """Least-squares ``y = a + b x``; with ``pin``, ``a >= 0`` (pinned to 0 and ``b`` refitted
    through the origin when it comes out negative); with ``rising_only`` also ``b >= 0``
    (pinned to 0, ``a`` the mean).

    Returns:
        ``(a, b)``; ``(None, mean y)`` when the points have one distinct ``x`` (no slope).
    """
    n = len(points)
    if n == 0:
        return 0.0, 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return None, my
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    if rising_only and b < 0:
        return max(my, 0.0), 0.0
    if a < 0 and pin:
        sx2 = sum(x * x for x, _ in points)
        return 0.0, max(sum(x * y for x, y in points) / sx2, 0.0)
    return a, b


@dataclass(frozen=True)
class Scaling:
    """Seconds of a stage on ``k`` devices: ``fixed + parallel / k``.

    ``parallel`` is negative for a stage measured slower on more devices (data-parallel
    communication outweighing the split work, as a tiny model's update on two CPU processes):
    the time then rises towards ``fixed``. ``fixed`` is negative for a stage measured to gain
    more than linearly from more devices (between the measured counts the line holds: two
    counts are predicted as measured); towards and beyond the widest measurement such a line
    reaches zero, so no more than linear gain from that measurement is assumed: ``widest / k``.

    Attributes:
        fixed: seconds more devices do not shorten.
        parallel: seconds on one device that data parallelism divides.
        widest: device-seconds of the widest measurement (its mean seconds times its
            devices) when ``fixed`` is negative, else 0: the least ``k`` devices take.
    """

    fixed: float
    parallel: float = 0.0
    widest: float = 0.0

    def at(self, k: int) -> float:
        """The stage's seconds on ``k`` devices."""
        k = max(k, 1)
        return max(self.fixed + self.parallel / k, self.widest / k, 0.0)

    def scaled(self, factor: float) -> Scaling:
        """The same scaling of ``factor`` times the seconds."""
        return Scaling(self.fixed * factor, self.parallel * factor, self.widest * factor)

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]]) -> Scaling:
        """Fit ``t(k)`` to measured ``(devices, seconds)`` points.

        With measurements at one device count only, more devices are assumed not to help
        (``parallel = 0``): the conservative reading of one point.

        Args:
            points: ``(k, seconds)`` pairs.

        Returns:
            The fit (``Scaling(0)`` without points).
        """
        pts = [(1.0 / max(k, 1), max(t, 0.0)) for k, t in points]
        a, b = _line(pts, rising_only=False, pin=False)
        if a is None:  # one device count
            return cls(fixed=b, parallel=0.0)
        if a >= 0:
            return cls(fixed=a, parallel=b)
        k = max(max(k, 1) for k, _ in points)  # the widest device count measured
        at_k = [max(t, 0.0) for n, t in points if max(n, 1) == k]
        return cls(fixed=a, parallel=b, widest=k * sum(at_k) / len(at_k))


@dataclass(frozen=True)
class Linear:
    """Seconds of one pipeline item holding ``m`` environments: ``per_item + per_env * m``.

    Attributes:
        per_item: seconds per item whatever its size (hand-off, call overhead).
        per_env: seconds per environment in the item (simulation or inference per observation).
    """

    per_item: float
    per_env: float = 0.0

    def at(self, m: float) -> float:
        """Seconds of an item of ``m`` environments."""
        return self.per_item + self.per_env * m

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> Linear:
        """Fit to measured ``(environments per item, seconds per item)`` points.

        With one item size only, time is taken as proportional to the environments (the
        simulator and the policy work per environment). An item never takes less time for
        holding more environments (``per_env >= 0``).

        Returns:
            The fit (``Linear(0)`` without points).
        """
        pts = [(float(m), max(t, 0.0)) for m, t in points]
        a, b = _line(pts, rising_only=True)
        if a is None:
            m = pts[0][0]
            return cls(per_item=0.0, per_env=b / m if m else 0.0)
        return cls(per_item=a, per_env=b)


@dataclass(frozen=True)
class ReasoningCosts:
    """What the reasoning cost model reads (seconds per step).

    Attributes:
        generate: the rollout's generation on ``k`` rollout devices (memory moves excluded).
        train: the actor's update on ``k`` actor devices (memory moves excluded).
        reward: scoring.
        sync: the new weights' export and hand-over.
        overhead: the driver's time between two steps, separate processes.
        moves: offload and reload when actor and rollout share ``k`` devices.
        fused_overhead: a fused step's time beyond its ranks' own stages (the one call per
            step, the driver between steps).
        old_logprobs: the actor's pi_old forward pass on ``k`` actor devices (``P``).
        old_logprob_passes: pi_old passes per step of the profiled synchronous runs (``train``
            includes them) and of an asynchronous candidate (``max_staleness=1``).
    """

    generate: Scaling
    train: Scaling
    reward: float = 0.0
    sync: float = 0.0
    overhead: float = 0.0
    moves: Scaling = field(default_factory=lambda: Scaling(0.0))
    fused_overhead: float = 0.0
    old_logprobs: Scaling = field(default_factory=lambda: Scaling(0.0))
    old_logprob_passes: tuple[int, int] = (0, 0)

    def train_at(self, k: int, staleness: int = 0) -> float:
        """``T(k)``, plus ``P(k)`` per pi_old pass a candidate of this staleness makes beyond
        the profiled runs' (module docstring)."""
        sync, asynchronous = self.old_logprob_passes
        extra = (asynchronous if staleness > 0 else sync) - sync
        return self.train.at(k) + extra * self.old_logprobs.at(k)


@dataclass(frozen=True)
class EmbodiedCosts:
    """What the embodied cost model reads.

    Attributes:
        env_item: one env process stepping one stage of ``m`` environments once.
        infer_item: one rollout rank inferring actions for one stage's ``m`` observations.
        train: the actor's PPO update on ``k`` actor devices (memory moves excluded).
        num_envs: ``env.num_envs``.
        rollout_steps: ``env.rollout_steps`` (steps per environment per epoch).
        sync: the new weights' export and hand-over.
        overhead: the driver's time between two steps.
        moves: offload and reload per step where components share devices.
        epoch_overhead: what an epoch costs beyond the formula (starting the serving and
            stepping calls, loading the new weights, filling and draining the channels).
    """

    env_item: Linear
    infer_item: Linear
    train: Scaling
    num_envs: int
    rollout_steps: int
    sync: float = 0.0
    overhead: float = 0.0
    moves: Scaling = field(default_factory=lambda: Scaling(0.0))
    epoch_overhead: float = 0.0


@dataclass(frozen=True)
class Prediction:
    """A candidate's predicted seconds per step.

    Attributes:
        seconds: the prediction.
        parts: the terms it is made of (seconds), for the ranking and the docs.
        formula: the formula applied, in the terms' names.
    """

    seconds: float
    parts: Mapping[str, float]
    formula: str

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "parts": dict(self.parts), "formula": self.formula}


def predict(
    cand: Candidate,
    costs: ReasoningCosts | EmbodiedCosts,
    busy: Callable[[int, int], float] | None = None,
) -> Prediction:
    """A candidate's seconds per step under the cost model (module docstring).

    Args:
        cand: the candidate.
        costs: the profile's fitted costs (reasoning or embodied).
        busy: ``carry``: ``(k rollout devices, max_staleness)`` -> the share of a static
            batch's decoding a call takes (:func:`rltrain.whatif.slots.carry_share` of the
            run's lengths); None: 1.

    Returns:
        The prediction.

    Raises:
        TypeError: costs of the other runner's kind.
    """
    if isinstance(costs, EmbodiedCosts):
        return _predict_embodied(cand, costs)
    if not isinstance(costs, ReasoningCosts):
        raise TypeError(f"costs must be ReasoningCosts or EmbodiedCosts, not {type(costs)}")
    c = costs
    g = c.generate.at(cand.rollout_devices)
    t = c.train_at(cand.actor_devices, cand.staleness)
    if cand.family == "collocated" and cand.fused:
        parts = {"generate": g, "reward": c.reward, "train": t, "overhead": c.fused_overhead}
        return Prediction(g + c.reward + t + c.fused_overhead, parts, "G + R + T + O_f")
    if cand.shares:  # taking turns: collocated or hybrid
        m = c.moves.at(cand.rollout_devices)
        parts = {
            "generate": g,
            "reward": c.reward,
            "train": t,
            "sync": c.sync,
            "moves": m,
            "overhead": c.overhead,
        }
        return Prediction(sum(parts.values()), parts, "G + R + T + S + M + O")
    learn = c.reward + t + c.sync
    parts = {"generate": g, "reward": c.reward, "train": t, "sync": c.sync, "overhead": c.overhead}
    if cand.staleness > 0 and cand.partial_rollout == "carry":
        b = busy(cand.rollout_devices, cand.staleness) if busy is not None else 1.0
        parts = {**parts, "generate": b * g}
        return Prediction(max(b * g, learn + c.overhead), parts, "max(b G, R + T + S + O)")
    if cand.staleness > 0:
        return _asynchronous(cand.partial_rollout, g, learn + c.overhead, c.generate.fixed, parts)
    return Prediction(g + learn + c.overhead, parts, "G + R + T + S + O")


def _asynchronous(
    policy: str, g: float, a: float, fixed: float, parts: dict[str, float]
) -> Prediction:
    """An asynchronous step: generation ``g`` beside the actor's part ``a``, and what the
    ``trainer.partial_rollout`` policy adds where a generation runs past the swap (``g > a``;
    module docstring). ``fixed`` is a generate call's fixed seconds ``F``."""
    if policy == "finish" or g <= a:
        return Prediction(max(g, a), parts, "max(G, R + T + S + O)")
    if policy == "restart":
        return Prediction(g + a, parts, "G + R + T + S + O (restart: G > A)")
    # the rollout decodes first and pays F last, so a stop A into the call keeps the decoding
    # done and the resumed call pays F again; F is a share of G, never more
    f = min(max(fixed, 0.0), g)
    return Prediction(max(g, a + f), {**parts, "fixed": f}, "max(G, R + T + S + O + F)")


def items_per_round(env_world: int, stages: int, rollout_world: int) -> int:
    """The most pipeline items one rollout rank serves per env step.

    Stages are dealt round-robin over the rollout ranks (item ``env_rank * S + stage`` goes to
    rank ``item % rollout_world``, as :func:`rltrain.workers.env.stage_to_rollout` does).
    """
    return math.ceil(env_world * stages / max(rollout_world, 1))


def pipeline_seconds(
    env_s: float, infer_s: float, stages: int, steps: int, env_world: int, rollout_world: int
) -> tuple[float, float, float]:
    """One rollout epoch by RLinf's pipeline formula ``T_critical + (N - 1) * T_bottleneck``.

    An env process holds ``S`` stages and steps each ``steps`` times, so ``N = steps x S`` items
    go through simulator and policy. ``T_critical = e + i`` is one item through both. The
    bottleneck per item is the slowest of: the env process (``e``: it steps its stages one after
    another), a rollout rank (``q x i / S``: it serves ``q`` items per env step, see
    :func:`items_per_round`) and a stage's own cycle (``(e + i) / S``: a stage steps again only
    once its actions are back). With one stage the cycle dominates and the formula is the
    sequential ``steps x (e + i)``; with enough stages it is the slower side.

    Args:
        env_s: ``e``, seconds one env process needs to step one stage.
        infer_s: ``i``, seconds one rollout rank needs to infer one stage's actions.
        stages: ``S`` (``env.pipeline_stage_num``).
        steps: ``env.rollout_steps``.
        env_world: env processes.
        rollout_world: rollout ranks.

    Returns:
        ``(epoch seconds, T_critical, T_bottleneck)``.
    """
    q = items_per_round(env_world, stages, rollout_world)
    critical = env_s + infer_s
    bottleneck = max(env_s, q * infer_s / stages, critical / stages)
    n = steps * stages
    return critical + (n - 1) * bottleneck, critical, bottleneck


def _predict_embodied(cand: Candidate, c: EmbodiedCosts) -> Prediction:
    stages = cand.stages or 1
    env_world = max(cand.env_devices, 1)  # on node 0: one env process
    m = c.num_envs / (env_world * stages)
    e, i = c.env_item.at(m), c.infer_item.at(m)
    epoch, critical, bottleneck = pipeline_seconds(
        e, i, stages, c.rollout_steps, env_world, cand.rollout_devices
    )
    t = c.train.at(cand.actor_devices)
    shares = cand.shares or cand.env is not None
    moves = c.moves.at(cand.actor_devices) if shares else 0.0
    parts = {
        "pipeline": epoch,
        "epoch_overhead": c.epoch_overhead,
        "train": t,
        "sync": c.sync,
        "moves": moves,
        "overhead": c.overhead,
    }
    total = sum(parts.values())
    parts.update(
        t_critical=critical, t_bottleneck=bottleneck, items=float(c.rollout_steps * stages)
    )
    return Prediction(total, parts, "T_crit + (N-1) T_b + E + T + S + M + O")


def costs_to_dict(costs: ReasoningCosts | EmbodiedCosts) -> dict[str, Any]:
    """The costs as JSON data (``kind`` says which)."""
    kind = "embodied" if isinstance(costs, EmbodiedCosts) else "reasoning"
    return {"kind": kind, **asdict(costs)}


def costs_from_dict(data: Mapping[str, Any]) -> ReasoningCosts | EmbodiedCosts:
    """Inverse of :func:`costs_to_dict`.

    Raises:
        KeyError / TypeError: for data not written by :func:`costs_to_dict`.
    """
    d = dict(data)
    kind = d.pop("kind")
    for key in ("generate", "train", "moves", "old_logprobs"):
        if key in d:
            d[key] = Scaling(**d[key])
    if "old_logprob_passes" in d:
        d["old_logprob_passes"] = tuple(int(x) for x in d["old_logprob_passes"])
    if kind == "embodied":
        d["env_item"] = Linear(**d["env_item"])
        d["infer_item"] = Linear(**d["infer_item"])
        return EmbodiedCosts(**d)
    return ReasoningCosts(**d)
