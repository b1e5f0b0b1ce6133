"""The components a placement may name: their entries."""

from __future__ import annotations

from typing import Any

from rltrain.kinds.records import ComponentKind


def _needs_critic(run: Any) -> bool:
    # imported here: importing rltrain.config first runs its package, whose checks read this
    # registry (rltrain.kinds.components imported alone would meet itself half made)
    from rltrain.config.algorithms import needs_critic

    return needs_critic(run.algorithm.advantage_estimator)


def _reward_worker(run: Any) -> str:
    """A reward model scores in its own worker; a rule in a light one."""
    if run.reward.kind == "model":
        return "rltrain.workers.reward:RewardModelWorker"
    return "rltrain.workers.reward:RewardWorker"


ACTOR = ComponentKind(
    name="actor",
    state_kinds=("weights", "grads", "optimizer"),
    summary="trains the policy",
    workers={"reasoning": "rltrain.workers.actor:ActorWorker"},
    layout_args=("sizes",),
    fused=True,
)
ROLLOUT = ComponentKind(
    name="rollout",
    state_kinds=("weights", "kv_cache"),
    summary="generates with the generation engine",
    workers={"reasoning": "rltrain.workers.rollout:RolloutWorker"},
    receives_weights=True,
    fused=True,
)
REWARD = ComponentKind(
    name="reward",
    state_kinds=("weights",),
    summary="scores: the task's rule, or a reward model (reward.kind)",
    workers={"reasoning": _reward_worker},
    fused=True,
)
REFERENCE = ComponentKind(
    name="reference",
    state_kinds=("weights",),
    summary="the frozen reference policy's log-probs for the KL",
    workers={"reasoning": "rltrain.workers.reference:ReferenceWorker"},
    built_when=lambda run: run.algorithm.kl_coef > 0,
)
CRITIC = ComponentKind(
    name="critic",
    state_kinds=("weights", "grads", "optimizer"),
    summary="the value model of PPO with GAE",
    workers={"reasoning": "rltrain.workers.critic:CriticWorker"},
    layout_args=("critic_sizes",),
    built_when=lambda run: _needs_critic(run),
)
INFERENCE = ComponentKind(
    name="inference",
    state_kinds=("weights",),
    summary="recomputes the step's log-probs on its own devices",
    workers={"reasoning": "rltrain.workers.inference:InferenceWorker"},
    receives_weights=True,
)
# A CPU simulator keeps its state in host memory: nothing for an offload policy to move (a GPU
# simulator's worker would report its buffers in state_bytes, and declare them here).
ENV = ComponentKind(name="env", summary="steps simulators (embodied runs)", state_kinds=())
TOOLS = ComponentKind(
    name="tools",
    state_kinds=(),
    summary="tool workers of multi-turn runs (task.env): host the environments, run tool calls",
    workers={"reasoning": "rltrain.workers.tools:ToolWorker"},
    built_when=lambda run: run.task.env is not None,
    cpu_only=True,
    serves_rollout=True,
)
