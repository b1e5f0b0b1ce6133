"""The algorithm vocabulary: every policy loss and advantage estimator by name, with the
properties the checks and the layout need (no torch, no Ray).

The code of each entry is registered by the same name in :mod:`rltrain.algorithms.registry`
(``@register_policy_loss("gspo")``, ``@register_advantage_estimator("grpo")``); a unit test
holds the two sets of names equal. ``algorithm.policy_loss`` and
``algorithm.advantage_estimator`` accept exactly these names, and validation, the layout and the
fusion rule ask the entries instead of testing strings.

Adding a policy loss: its function in ``rltrain/algorithms/losses.py`` (registered) and its
entry here; a preset in ``conf/algorithm/`` if it comes with settings of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EstimatorSpec:
    """What an advantage estimator needs and how far its statistics reach.

    Attributes:
        group_based: compares the ``rollout.n_samples_per_prompt`` samples of one prompt
            (needs at least 2; a group of equal rewards gives advantage 0).
        needs_critic: reads token values from a critic component.
        batch_wide: its statistics span the whole step's batch (whitening), so a rank that sees
            only its own prompt groups cannot compute it alone.
        reads: the options of :data:`ESTIMATOR_OPTIONS` its registered function reads (as the
            keywords ``norm_by_std``, ``gamma``, ``lam``); one it does not read is refused when
            set away from its default (:mod:`rltrain.config.unread`).
        summary: one line for messages and docs.
    """

    group_based: bool
    needs_critic: bool = False
    batch_wide: bool = False
    reads: tuple[str, ...] = ()
    summary: str = ""


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss's entry.

    Attributes:
        summary: one line for messages and docs.
    """

    summary: str = ""


#: ``algorithm.*`` options read by some advantage estimators only (:attr:`EstimatorSpec.reads`).
ESTIMATOR_OPTIONS = ("norm_adv_by_std", "gamma", "lam")

ADVANTAGE_ESTIMATORS: dict[str, EstimatorSpec] = {
    "grpo": EstimatorSpec(True, reads=("norm_adv_by_std",), summary="(r - group mean) / group std"),
    "dr_grpo": EstimatorSpec(True, summary="r - group mean"),
    "rloo": EstimatorSpec(True, summary="r - mean of the other samples of the group"),
    "reinforce_pp": EstimatorSpec(
        False,
        batch_wide=True,
        reads=("gamma",),
        summary="discounted token returns, whitened over the batch",
    ),
    "gae": EstimatorSpec(
        False,
        needs_critic=True,
        batch_wide=True,
        reads=("gamma", "lam"),
        summary="token-level GAE from a critic",
    ),
}

POLICY_LOSSES: dict[str, PolicyLossSpec] = {
    "ppo_clip": PolicyLossSpec("PPO's clipped surrogate, one ratio per token"),
    "gspo": PolicyLossSpec("GSPO: clipped surrogate of the length-normalised sequence ratio"),
}

#: ``algorithm.loss_agg`` values (how token losses become one number).
LOSS_AGGS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm")

#: ``algorithm.kl_estimator`` values.
KL_ESTIMATORS = ("k1", "k2", "k3")


def group_estimators() -> tuple[str, ...]:
    """Names of the group-based advantage estimators, in vocabulary order."""
    return tuple(n for n, s in ADVANTAGE_ESTIMATORS.items() if s.group_based)


def is_group_based(estimator: str) -> bool:
    """True when ``estimator`` compares the samples of one prompt (False for unknown names)."""
    spec = ADVANTAGE_ESTIMATORS.get(estimator)
    return spec is not None and spec.group_based


def needs_critic(estimator: str) -> bool:
    """True when ``estimator`` reads a critic's values (False for unknown names)."""
    spec = ADVANTAGE_ESTIMATORS.get(estimator)
    return spec is not None and spec.needs_critic


def is_batch_wide(estimator: str) -> bool:
    """True when ``estimator``'s statistics span the step's whole batch (False for unknown
    names)."""
    spec = ADVANTAGE_ESTIMATORS.get(estimator)
    return spec is not None and spec.batch_wide


def estimator_reads(estimator: str, option: str) -> bool:
    """True when ``estimator``'s function reads ``algorithm.<option>`` (an option of
    :data:`ESTIMATOR_OPTIONS`); True for unknown names, which are refused on their own."""
    spec = ADVANTAGE_ESTIMATORS.get(estimator)
    return spec is None or option in spec.reads


def option_readers(option: str) -> tuple[str, ...]:
    """Names of the estimators that read ``algorithm.<option>``, in vocabulary order."""
    return tuple(n for n, s in ADVANTAGE_ESTIMATORS.items() if option in s.reads)
