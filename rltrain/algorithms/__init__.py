"""RL algorithms in plain torch: advantage estimators, losses, KL, sampling and the update.

Nothing here imports Ray or keeps global state; workers of the distributed trainer call these
functions on their own models and batches.
"""

from __future__ import annotations

from rltrain.algorithms.advantages import (
    ESTIMATORS,
    GROUP_ESTIMATORS,
    compute_advantages,
    discounted_returns,
    dr_grpo_advantages,
    gae_advantages,
    grpo_advantages,
    masked_whiten,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.critic import ValueModel, compute_values, language_model_trunk
from rltrain.algorithms.logprobs import compute_logprobs, position_ids_from_mask
from rltrain.algorithms.losses import (
    KL_ESTIMATORS,
    LOSS_AGGS,
    PolicyLossOutput,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    value_loss,
)
from rltrain.algorithms.sampling import (
    SamplingParams,
    decode_responses,
    encode_prompts,
    generate,
    greedy_accuracy,
    next_tokens,
    top_p_filter,
)
from rltrain.algorithms.update import (
    Ranks,
    UpdateSettings,
    accumulate_step,
    actor_loss,
    add_advantages,
    behaviour_logprobs,
    critic_loss,
    micro_slices,
    micro_weights,
    minibatch_indices,
    ppo_update,
    rank_token_shares,
    update_minibatches,
    value_update,
)

__all__ = [
    "ESTIMATORS",
    "GROUP_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGGS",
    "PolicyLossOutput",
    "Ranks",
    "RolloutBatch",
    "SamplingParams",
    "UpdateSettings",
    "ValueModel",
    "accumulate_step",
    "actor_loss",
    "add_advantages",
    "aggregate",
    "behaviour_logprobs",
    "compute_advantages",
    "compute_logprobs",
    "compute_values",
    "critic_loss",
    "decode_responses",
    "discounted_returns",
    "dr_grpo_advantages",
    "encode_prompts",
    "entropy_from_logits",
    "gae_advantages",
    "generate",
    "greedy_accuracy",
    "grpo_advantages",
    "kl_penalty",
    "language_model_trunk",
    "masked_whiten",
    "micro_slices",
    "micro_weights",
    "minibatch_indices",
    "rank_token_shares",
    "update_minibatches",
    "next_tokens",
    "outcome_token_rewards",
    "policy_loss",
    "position_ids_from_mask",
    "ppo_update",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "top_p_filter",
    "value_loss",
    "value_update",
]
