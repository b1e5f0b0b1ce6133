"""The layouts the automatic placement considers, and each one as a run config.

Enumeration is linear in the number of devices ``D`` (never a search over subsets): components
take contiguous ranges of global device ranks, so a layout is fixed by a few counts.

Reasoning runs (actor, rollout; the reward and any reference/critic follow the actor):

- ``collocated``: actor and rollout on all ``D`` devices, fused into one process per device
  (``placement.fuse=true``) or taking turns as separate processes (``fuse=false``).
- ``disaggregated``: rollout on the last ``k`` devices, actor on the first ``D - k``, for every
  ``k`` in ``1..D-1``; each with every allowed ``trainer.max_staleness`` (0 and 1), and an
  asynchronous one (``max_staleness >= 1``) with every allowed ``trainer.partial_rollout``
  (``finish`` and ``continue`` by default; a synchronous loop has no generation running at a
  weight swap, so its policy is ``finish``).
- ``hybrid``: actor on all ``D`` devices, rollout on the last ``k`` (``1..D-1``), taking turns
  where they share; synchronous only (rollout and actor share devices).

Embodied runs (env, rollout, actor), each with every pipeline stage count ``S``:

- ``collocated``: actor and rollout on all devices, the simulators on node 0 (no device).
- ``disaggregated``: rollout on the last ``k`` devices, actor on the first ``D - k``,
  simulators on node 0.
- ``hybrid``: simulators on the first ``k`` devices (one process each), rollout on the rest,
  actor on all (RLinf's embodied hybrid).

That is ``2 + (D - 1) x (2 + |P|)`` reasoning candidates (``|P|`` partial-rollout policies;
``4D - 2`` by default) and ``(2D - 1) x |S|`` embodied ones. Nothing
here imports Ray or torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.config.offload import resolve_offload
from rltrain.config.schema import OffloadPolicyConfig

#: The least ``trainer.max_staleness`` a policy runs with, where it is more than 1: a row
#: ``carry`` hands into the next call trains 2 versions after it started (docs/async.md#carry).
#: An asynchronous candidate with such a policy runs at this staleness.
MIN_STALENESS: Mapping[str, int] = {"carry": 2}
#: Components the layouts place explicitly; every other one follows the actor.
PLACED = ("actor", "rollout", "env")
#: Offload policies used where actor/rollout/env share devices and the base config gives none.
SHARED_OFFLOAD: Mapping[str, Mapping[str, Any]] = {
    "actor": {"when": "on_demand", "states": ["weights", "grads", "optimizer"]},
    "rollout": {"when": "on_demand", "states": ["weights", "kv_cache"]},
}
#: The simulators' place when they hold no device: node 0, as the shipped presets put them.
ON_NODE: Mapping[str, str] = {"node_group": "node", "placement": "0"}

Span = tuple[int, int]  # [first, last + 1) of global device ranks


@dataclass(frozen=True)
class Candidate:
    """One layout to predict, check and maybe run.

    Attributes:
        family: ``collocated``, ``disaggregated`` or ``hybrid``.
        actor: the actor's device ranks ``[lo, hi)``.
        rollout: the rollout's device ranks ``[lo, hi)``.
        env: the simulators' device ranks, or None for node 0 without devices (embodied).
        fused: actor, rollout and reward in one process per device (collocated reasoning).
        staleness: ``trainer.max_staleness``.
        stages: ``env.pipeline_stage_num`` (embodied), or None.
        partial_rollout: ``trainer.partial_rollout`` (``finish`` for a synchronous layout).
    """

    family: str
    actor: Span
    rollout: Span
    env: Span | None = None
    fused: bool = False
    staleness: int = 0
    stages: int | None = None
    partial_rollout: str = "finish"

    @property
    def actor_devices(self) -> int:
        return self.actor[1] - self.actor[0]

    @property
    def rollout_devices(self) -> int:
        return self.rollout[1] - self.rollout[0]

    @property
    def env_devices(self) -> int:
        return 0 if self.env is None else self.env[1] - self.env[0]

    @property
    def shares(self) -> bool:
        """Whether actor and rollout hold a device in common (they take turns there)."""
        return self.actor[0] < self.rollout[1] and self.rollout[0] < self.actor[1]

    @property
    def name(self) -> str:
        """A short, unique, human-readable label."""
        if self.family == "collocated":
            head = f"collocated {span_text(self.actor)}"
            if self.stages is None:
                head += " fused" if self.fused else " turns"
        else:
            parts = [f"actor {span_text(self.actor)}", f"rollout {span_text(self.rollout)}"]
            if self.env is not None:
                parts.insert(0, f"env {span_text(self.env)}")
            head = f"{self.family} " + " ".join(parts)
        if self.staleness:
            head += f" async{self.staleness}"
        if self.partial_rollout != "finish":  # finish keeps the names it always had
            head += f" {self.partial_rollout}"
        if self.stages is not None:
            head += f" S={self.stages}"
        return head


def span_text(span: Span) -> str:
    """Device ranks in the placement grammar: ``"3"`` or ``"0-3"``."""
    lo, hi = span
    return str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}"


def reasoning_candidates(
    devices: int,
    families: Iterable[str] = ("collocated", "disaggregated", "hybrid"),
    staleness: Iterable[int] = (0, 1),
    partial_rollout: Iterable[str] = ("finish", "continue"),
) -> list[Candidate]:
    """Every reasoning layout on ``devices`` devices (see the module docstring).

    Args:
        devices: the cluster's devices ``D``.
        families: the families to enumerate.
        staleness: ``trainer.max_staleness`` values for layouts with actor and rollout apart.
        partial_rollout: ``trainer.partial_rollout`` policies for the asynchronous ones
            (``max_staleness >= 1``), in the order given; a policy with a least staleness
            (:data:`MIN_STALENESS`) runs at least at it.

    Returns:
        The candidates: at most ``2 + (D - 1) x (|staleness without 0| x |partial_rollout|
        + 2)``.
    """
    fams, ks = set(families), sorted(set(staleness))
    policies = list(dict.fromkeys(partial_rollout))
    out: list[Candidate] = []
    every = (0, devices)
    if "collocated" in fams:
        out.append(Candidate("collocated", every, every, fused=True))
        out.append(Candidate("collocated", every, every, fused=False))
    for k in range(1, devices):
        if "disaggregated" in fams:
            actor, rollout = (0, devices - k), (devices - k, devices)
            seen = set()
            for s in ks:
                for policy in policies if s > 0 else ["finish"]:
                    k_run = max(s, MIN_STALENESS.get(policy, s)) if s > 0 else 0
                    if (k_run, policy) not in seen:
                        seen.add((k_run, policy))
                        out.append(
                            Candidate(
                                "disaggregated",
                                actor,
                                rollout,
                                staleness=k_run,
                                partial_rollout=policy,
                            )
                        )
        if "hybrid" in fams:
            out.append(Candidate("hybrid", every, (devices - k, devices)))
    return out


#: ``trainer.partial_rollout`` policies, in the order the ranking prefers them on a tie.
PARTIAL_ROLLOUTS = ("finish", "continue", "restart", "carry")
#: The policies an asynchronous candidate tries unless ``placement.auto.partial_rollout`` says.
DEFAULT_PARTIAL_ROLLOUTS = ("finish", "continue")


def partial_rollout_policies(requested: Sequence[str] | None, fixed: str) -> tuple[str, ...]:
    """The ``trainer.partial_rollout`` policies the asynchronous candidates try.

    Args:
        requested: ``placement.auto.partial_rollout`` (None: not set).
        fixed: ``trainer.partial_rollout``; ``restart`` or ``continue`` there is the user's
            choice and is kept (the config check refuses a list that leaves it out).

    Returns:
        The requested list; unset, ``(fixed,)`` for a chosen policy, else
        :data:`DEFAULT_PARTIAL_ROLLOUTS`.
    """
    if requested is not None:
        return tuple(dict.fromkeys(str(p) for p in requested))
    return DEFAULT_PARTIAL_ROLLOUTS if fixed == "finish" else (fixed,)


def embodied_candidates(
    devices: int,
    stage_counts: Sequence[int],
    families: Iterable[str] = ("collocated", "disaggregated", "hybrid"),
) -> list[Candidate]:
    """Every embodied layout on ``devices`` devices, each with every stage count.

    Args:
        devices: the cluster's devices ``D``.
        stage_counts: ``env.pipeline_stage_num`` values.
        families: the families to enumerate.

    Returns:
        The candidates: at most ``(2D - 1) x len(stage_counts)``.
    """
    fams = set(families)
    every = (0, devices)
    out: list[Candidate] = []
    for s in stage_counts:
        if "collocated" in fams:
            out.append(Candidate("collocated", every, every, stages=s))
        for k in range(1, devices):
            if "disaggregated" in fams:
                out.append(
                    Candidate("disaggregated", (0, devices - k), (devices - k, devices), stages=s)
                )
            if "hybrid" in fams:
                out.append(Candidate("hybrid", every, (k, devices), env=(0, k), stages=s))
    return out


def stage_counts(num_envs: int, requested: Sequence[int], defaults: Sequence[int]) -> list[int]:
    """The pipeline stage counts worth trying: the requested ones, else the defaults that divide
    ``env.num_envs`` (a stage holds ``num_envs / (processes x S)`` environments)."""
    if requested:
        return sorted(set(requested))
    return [s for s in defaults if s <= num_envs and num_envs % s == 0]


# ------------------------------------------------------------------------- as a run config
def _split_entries(cp: Mapping[str, Any]) -> dict[str, Any]:
    """component -> its entry, with RLinf's combined keys (``"actor,rollout": all``) split."""
    out: dict[str, Any] = {}
    for key, value in cp.items():
        for name in str(key).split(","):
            if name.strip():
                out[name.strip()] = value
    return out


def _on_node(entry: Any) -> bool:
    return isinstance(entry, Mapping) and str(entry.get("node_group", "")) not in ("", "cluster")


def component_placement(base: Mapping[str, Any], cand: Candidate) -> dict[str, Any]:
    """The ``placement.component_placement`` of a candidate.

    Components the layouts do not place themselves keep a node placement from the base config
    (the rule reward on node 0) and otherwise follow the actor's devices (a reference, a critic,
    a reward model), because their stages run in the actor's phase of the step.
    """
    out: dict[str, Any] = {"actor": span_text(cand.actor), "rollout": span_text(cand.rollout)}
    if cand.stages is not None:
        out["env"] = dict(ON_NODE) if cand.env is None else span_text(cand.env)
    for name, entry in _split_entries(base).items():
        if name in PLACED:
            continue
        out[name] = _plain(entry) if _on_node(entry) else span_text(cand.actor)
    return out


def offload_policies(base: Mapping[str, Any], cand: Candidate) -> dict[str, Any]:
    """The ``placement.offload`` of a candidate.

    Components that share devices take turns: they keep the base config's policy when it moves
    state, else they get :data:`SHARED_OFFLOAD` (on demand: state leaves only when the next
    stage lacks the room). Actor and rollout alone on their devices keep their state (no
    policy). Other components keep the base's policy.
    """
    sharing = {"actor", "rollout"} if cand.shares else set()
    if cand.env is not None:
        sharing |= {"env", "actor"}  # hybrid: simulators on devices the actor trains on
    out: dict[str, Any] = {name: policy for name, policy in base.items() if name not in PLACED}
    for name in sorted(sharing & set(SHARED_OFFLOAD)):  # a simulator holds no device state
        policy = base.get(name)
        moves = policy is not None and resolve_offload(policy, f"placement.offload.{name}").enabled
        out[name] = policy if moves else _policy(**SHARED_OFFLOAD[name])
    if cand.stages is not None and "rollout" in sharing:
        # the embodied policy is an MLP: no KV cache to name in its policy
        out["rollout"] = _policy(
            resolve_offload(out["rollout"], "placement.offload.rollout").when, ["weights"]
        )
    return out


def _policy(when: str, states: Sequence[str]) -> OffloadPolicyConfig:
    return OffloadPolicyConfig(when=when, states=list(states))


def apply(run: Any, cand: Candidate) -> Any:
    """The run config of a candidate: the base run with its placement (and staleness, partial
    rollout policy, stage count, fusion) replaced; ``placement.mode`` is null so the plan
    classifies the layout. A candidate whose policy is not ``carry`` drops
    ``trainer.carry_segment`` and ``trainer.carry_surplus``, which only ``carry`` reads.

    Args:
        run: the base :class:`~rltrain.config.schema.RunConfig`.
        cand: the candidate.

    Returns:
        A new RunConfig (the base is not modified).
    """
    p = run.placement
    placement = dataclasses.replace(
        p,
        mode=None,
        component_placement=component_placement(_plain(p.component_placement) or {}, cand),
        offload=offload_policies(dict(p.offload or {}), cand),
        fuse="true" if cand.fused else "false",
    )
    trainer = dataclasses.replace(
        run.trainer, max_staleness=cand.staleness, partial_rollout=cand.partial_rollout
    )
    if cand.partial_rollout != "carry":  # carry's keys shape its buffer: no other policy has one
        trainer = dataclasses.replace(trainer, carry_segment=None, carry_surplus=None)
    changes: dict[str, Any] = {"placement": placement, "trainer": trainer}
    if cand.stages is not None:
        changes["env"] = dataclasses.replace(run.env, pipeline_stage_num=cand.stages)
    return dataclasses.replace(run, **changes)


def _plain(value: Any) -> Any:
    """A placement entry as plain dicts and lists (the candidate must not alias the base's)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def as_set_by_hand(cand_run: Any) -> Any:
    """A candidate's config as a user would write that layout: without ``placement.auto``, the
    search's own settings, which the config refuses outside ``placement=auto``."""
    from rltrain.config.schema import AutoPlacementConfig

    placement = dataclasses.replace(cand_run.placement, auto=AutoPlacementConfig())
    return dataclasses.replace(cand_run, placement=placement)
