"""Resolve an offload policy (with RLinf's alias spellings) into one frozen record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rltrain.config.schema import OFFLOAD_WHEN, STATE_KINDS, OffloadPolicyConfig
from rltrain.errors import ConfigError

_ALIASES = {"offload_weight": "weights", "offload_grad": "grads", "offload_optimizer": "optimizer"}


@dataclass(frozen=True)
class OffloadPolicy:
    """When a component's state leaves its devices, and which kinds of state may leave.

    Attributes:
        when: ``never`` (stay resident), ``after_stage`` (leave after every stage the component
            runs, RLinf's and OpenRLHF's behaviour) or ``on_demand`` (stay until another
            component needs the room).
        states: the state kinds that may leave, a subset of ``weights``, ``grads``,
            ``optimizer``, ``kv_cache``.
    """

    when: str = "never"
    states: frozenset[str] = frozenset()

    @property
    def enabled(self) -> bool:
        return self.when != "never" and bool(self.states)

    def may_offload(self, kind: str) -> bool:
        return self.enabled and kind in self.states


def policy_config(policy: Any, key: str) -> OffloadPolicyConfig | None:
    """An offload policy as given in the config (a mapping, a record or null) as a record.

    Args:
        policy: ``placement.offload.<component>`` as composed.
        key: its config key, for messages.

    Returns:
        The record, or None for null.

    Raises:
        ConfigError: for keys the policy does not have or values of the wrong type.
    """
    if policy is None or isinstance(policy, OffloadPolicyConfig):
        return policy
    if not isinstance(policy, Mapping):
        raise ConfigError(
            f"{key}={policy!r} must be a mapping such as {{when: after_stage, states: [weights]}}"
        )
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    try:
        node = OmegaConf.merge(OmegaConf.structured(OffloadPolicyConfig), dict(policy))
    except ConfigKeyError as exc:
        known = ", ".join(OffloadPolicyConfig.__dataclass_fields__)
        raise ConfigError(
            f"{key}.{getattr(exc, 'key', '?')} is not an offload policy key: known keys are {known}"
        ) from None
    except ValidationError as exc:
        raise ConfigError(
            f"{key}.{getattr(exc, 'key', '?')}: {str(exc.msg).splitlines()[0]}"
        ) from None
    return OmegaConf.to_object(node)


def resolve_offload(policy: OffloadPolicyConfig | Mapping | None, key: str) -> OffloadPolicy:
    """Apply the alias spellings and check the values of one component's offload policy.

    If any of ``offload_weight`` / ``offload_grad`` / ``offload_optimizer`` is given, the state
    kinds are exactly those set true (plus ``kv_cache`` if ``states`` lists it), as in RLinf where
    an unset flag means "keep on device". Any alias set true turns ``when: never`` into
    ``after_stage``.

    Args:
        policy: the policy as configured (a record or a mapping), or None for "never offload".
        key: the config key of the policy, used in error messages (``placement.offload.actor``).

    Returns:
        The resolved, frozen policy.

    Raises:
        ConfigError: for an unknown ``when`` or state kind, or aliases that contradict ``when``.
    """
    policy = policy_config(policy, key)
    if policy is None:
        return OffloadPolicy()
    problems = []
    when = policy.when
    if when not in OFFLOAD_WHEN:
        problems.append(f"{key}.when={when!r} is not one of {list(OFFLOAD_WHEN)}")
    unknown = [s for s in policy.states if s not in STATE_KINDS]
    if unknown:
        problems.append(
            f"{key}.states has unknown state kinds {unknown}; choose from {list(STATE_KINDS)}"
        )
    states = {s for s in policy.states if s in STATE_KINDS}
    given = {k: getattr(policy, k) for k in _ALIASES if getattr(policy, k) is not None}
    if given:
        states = {_ALIASES[k] for k, v in given.items() if v} | (states & {"kv_cache"})
    if policy.enable_offload is False and when != "never":
        problems.append(
            f"{key}.enable_offload=false contradicts {key}.when={when!r}: "
            f"drop enable_offload or set when: never"
        )
    elif (policy.enable_offload or any(given.values())) and when == "never":
        when = "after_stage"
    if problems:
        raise ConfigError(problems)
    return OffloadPolicy(when=when, states=frozenset(states) if when != "never" else frozenset())
