"""Policy losses and advantage estimators by name.

Each is one function registered under the name ``algorithm.policy_loss`` /
``algorithm.advantage_estimator`` gives (``@register_policy_loss("gspo")``); the update looks
it up here. The names and their properties (group-based, needs a critic, token or sequence
ratio) are declared torch-free in :mod:`rltrain.config.algorithms`, which validation reads; a
name registered here must be declared there, and a unit test holds the two sets equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import Tensor

from rltrain.config.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from rltrain.errors import ConfigError


@dataclass(frozen=True)
class PolicyLossInputs:
    """The per-token tensors a policy loss reads (``[B, R]`` each).

    Attributes:
        logprobs: under the policy being trained (with grad).
        old_logprobs: under pi_old, the policy the ratio is taken against.
        advantages: per-token advantages.
        response_mask: 1 on tokens that count in the loss.
        rollout_logprobs: under pi_rollout, for the truncated importance correction of a
            recomputed pi_old (``algorithm.tis_cap``); None: no correction.
        norm_len: the constant length of ``seq_mean_token_sum_norm`` (the response budget).
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    response_mask: Tensor
    rollout_logprobs: Tensor | None = None
    norm_len: int | None = None


F = TypeVar("F", bound=Callable[..., Any])

#: name -> ``fn(inputs: PolicyLossInputs, algorithm: AlgorithmConfig) -> PolicyLossOutput``.
POLICY_LOSS_REGISTRY: dict[str, Callable[..., Any]] = {}
#: name -> ``fn(token_rewards [B, R], mask [B, R], *, group_size, norm_by_std, values, gamma,
#: lam) -> (advantages [B, R], returns [B, R] or None)``. A group estimator is also called
#: with ``group_size`` and ``norm_by_std`` only (each group's valid rows when episodes fail),
#: so each takes the keywords it reads and ``**_`` for the rest.
ADVANTAGE_REGISTRY: dict[str, Callable[..., Any]] = {}


def _register(table: dict[str, Callable[..., Any]], declared: dict[str, Any], what: str):
    def named(name: str) -> Callable[[F], F]:
        if name not in declared:
            raise ValueError(
                f"{what} {name!r} is not declared in rltrain/config/algorithms.py: add its entry "
                f"there (validation reads the names from it)"
            )

        def register(fn: F) -> F:
            if name in table and table[name] is not fn:
                raise ValueError(f"{what} {name!r} is registered twice")
            table[name] = fn
            return fn

        return register

    return named


#: ``@register_policy_loss("name")``: register a policy loss under a declared name.
register_policy_loss = _register(POLICY_LOSS_REGISTRY, POLICY_LOSSES, "policy loss")
#: ``@register_advantage_estimator("name")``: register an estimator under a declared name.
register_advantage_estimator = _register(
    ADVANTAGE_REGISTRY, ADVANTAGE_ESTIMATORS, "advantage estimator"
)


def _lookup(table: dict[str, Callable[..., Any]], key: str, name: str) -> Callable[..., Any]:
    # The built-in functions registered when their modules were imported: the package's
    # __init__ imports them, and importing this module imports the package first.
    fn = table.get(name)
    if fn is None:
        raise ConfigError(f"{key}={name!r} is not valid: choose one of {sorted(table)}")
    return fn


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name``.

    Raises:
        ConfigError: no such loss (names ``algorithm.policy_loss`` and the choices).
    """
    return _lookup(POLICY_LOSS_REGISTRY, "algorithm.policy_loss", name)


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as ``name``.

    Raises:
        ConfigError: no such estimator (names ``algorithm.advantage_estimator``).
    """
    return _lookup(ADVANTAGE_REGISTRY, "algorithm.advantage_estimator", name)
