"""Calibration: what rltrain's own runtime adds to device time, fitted from a profile.

The simulator's device time comes from the roofline (real hardware) or the ``simulate.*``
latencies (simulated devices). What it cannot derive is rltrain's own time around that work: a
worker call's round trip, the driver between steps, the weight hand-over, the rule reward, the
host compute of a tiny model on simulated devices. :data:`DEFAULT` holds figures measured on the
2-core development VM; :func:`from_profile` fits them from a ``placement=auto`` profile of the
same run (its cached ``costs``), which measured them on the user's own cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Calibration:
    """rltrain's runtime terms (seconds).

    Attributes:
        call_s: a worker call's round trip (submit, dispatch, result), per stage call.
        overhead_s: the driver's time between two steps, separate processes.
        fused_overhead_s: a fused step's time beyond its ranks' stages.
        sync_s: handing new weights over beyond their bytes (export, load, bookkeeping).
        reward_s: a rule reward's scoring of a step's batch.
        generate_extra_s: a generate call's host work beyond the modelled device time, on one
            device; ``generate_parallel_s`` is the share of it more devices divide
            (``extra(k) = fixed + parallel / k``, as placement=auto fits it).
        decode_step_s: a simulated device's host work per decoding step (a tiny model's
            token loop on the CPU).
        train_extra_s: an update's host work beyond the modelled device time, likewise.
        env_item_s: embodied: an env process's work per pipeline item beyond its latency;
            ``env_per_env_s`` per environment in the item.
        infer_item_s: embodied: a rollout rank's work per item beyond its latency;
            ``infer_per_env_s`` per environment.
        epoch_extra_s: embodied: an epoch's start and drain beyond the pipeline.
        move_s: an offload or a reload call beyond its bytes (simulated devices).
        source: ``default`` or the profile it was fitted from.
    """

    call_s: float = 0.004
    # The driver between steps, a weight hand-over's fixed part and a rule reward of a small
    # batch, as the spans of real runs on the VM show them (traces of split layouts, sync and
    # pipelined: 0.5-2.6 ms gaps, 0.4-0.6 ms sync spans, 0.2-0.5 ms reward spans).
    overhead_s: float = 0.002
    fused_overhead_s: float = 0.005
    sync_s: float = 0.001
    reward_s: float = 0.001
    generate_extra_s: float = 0.005
    generate_parallel_s: float = 0.0
    decode_step_s: float = 0.002
    train_extra_s: float = 0.01
    train_parallel_s: float = 0.0
    env_item_s: float = 0.002
    env_per_env_s: float = 0.0
    infer_item_s: float = 0.003
    infer_per_env_s: float = 0.0
    epoch_extra_s: float = 0.05
    move_s: float = 0.01
    source: str = "default"

    def generate_extra(self, k: int) -> float:
        """Host work of a generate call on a rollout of ``k`` ranks."""
        return max(self.generate_extra_s + self.generate_parallel_s / max(k, 1), 0.0)

    def train_extra(self, k: int) -> float:
        """Host work of an update on an actor of ``k`` ranks."""
        return max(self.train_extra_s + self.train_parallel_s / max(k, 1), 0.0)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


#: Measured on the 2-core development VM (docs/whatif.md, "Calibration").
DEFAULT = Calibration()


def _residual(s: Mapping[str, float], knob: float) -> tuple[float, float]:
    """A fitted ``fixed + parallel / k`` with the modelled latency ``knob`` (in ``fixed``:
    every rank waits it whatever ``k``) taken out."""
    return float(s.get("fixed", 0.0)) - knob, float(s.get("parallel", 0.0))


def from_profile(costs: Mapping[str, Any], run: Any, source: str) -> Calibration:
    """Fit the runtime terms from a ``placement=auto`` profile's costs of the same run.

    The profile's stage times include the ``simulate.*`` latencies it ran with (the same as
    ``run``'s: they are part of the profile's key); what is left after them is rltrain's.

    Args:
        costs: the profile's ``costs`` (``rltrain.autoplace.cost.costs_to_dict``).
        run: the run config the profile belongs to.
        source: where the profile came from (for the report).

    Returns:
        The calibration (defaults for terms the profile lacks).
    """
    sim = run.simulate
    c = DEFAULT
    if costs.get("kind") == "embodied":
        env_knob = (sim.env_step_latency_ms + sim.env_step_jitter_ms / 2) / 1000
        inf_knob = (sim.env_policy_latency_ms + sim.env_policy_jitter_ms / 2) / 1000
        env, inf = costs.get("env_item", {}), costs.get("infer_item", {})
        return replace(
            c,
            env_item_s=max(float(env.get("per_item", 0.0)), 0.0),
            env_per_env_s=max(float(env.get("per_env", 0.0)) - env_knob, 0.0),
            infer_item_s=max(float(inf.get("per_item", 0.0)), 0.0),
            infer_per_env_s=max(float(inf.get("per_env", 0.0)) - inf_knob, 0.0),
            epoch_extra_s=float(costs.get("epoch_overhead", c.epoch_extra_s)),
            sync_s=float(costs.get("sync", c.sync_s)),
            overhead_s=float(costs.get("overhead", c.overhead_s)),
            train_extra_s=_residual(costs.get("train", {}), sim.actor_latency_ms / 1000)[0],
            train_parallel_s=_residual(costs.get("train", {}), 0.0)[1],
            source=source,
        )
    gen_knob = sim.rollout_latency_ms + sim.rollout_token_latency_ms * run.rollout.max_new_tokens
    gen_fixed, gen_par = _residual(costs.get("generate", {}), gen_knob / 1000)
    train_fixed, train_par = _residual(costs.get("train", {}), sim.actor_latency_ms / 1000)
    return replace(
        c,
        overhead_s=float(costs.get("overhead", c.overhead_s)),
        fused_overhead_s=float(costs.get("fused_overhead", c.fused_overhead_s)),
        sync_s=float(costs.get("sync", c.sync_s)),
        reward_s=float(costs.get("reward", c.reward_s)),
        generate_extra_s=gen_fixed,
        generate_parallel_s=gen_par,
        train_extra_s=train_fixed,
        train_parallel_s=train_par,
        source=source,
    )
