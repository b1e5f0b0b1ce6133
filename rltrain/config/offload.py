"""Resolve an offload policy (with RLinf's alias spellings) into one frozen record, and refuse
policies that would move nothing, or not what they say (:func:`offload_problems`, a config
check)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rltrain.config.checks import check
from rltrain.config.numerics import node_placement_keys, placed_components
from rltrain.config.schema import OFFLOAD_WHEN, STATE_KINDS, OffloadPolicyConfig, RunConfig
from rltrain.errors import ConfigError
from rltrain.kinds import registry

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
    ``after_stage``; ``enable_offload=true`` turns ``on_demand`` into ``after_stage`` too (RLinf's
    meaning: the state leaves after every stage).

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
    elif policy.enable_offload or (any(given.values()) and when == "never"):
        # RLinf's enable_offload=true moves the state out after every stage: on a shipped
        # on_demand policy too, or the key would change nothing there
        when = "after_stage"
    if problems:
        raise ConfigError(problems)
    return OffloadPolicy(when=when, states=frozenset(states) if when != "never" else frozenset())


def held_states(run: Any, component: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """The state kinds a component holds, and those of them an offload policy can move.

    Args:
        run: the run config (its ``rollout.backend``).
        component: the component's name.

    Returns:
        ``(held, movable)``; None for a component whose entry declares no ``state_kinds``
        (``env``), or an unknown name. A ``kv_cache`` the generation engine frees after every
        generate (not ``kv_reserved``: torch) is held but not movable.
    """
    if component not in registry.component_names():
        return None
    kinds = registry.component(component).state_kinds
    if kinds is None:
        return None
    held = movable = frozenset(kinds)
    if "kv_cache" in held and not _kv_reserved(run):
        movable -= {"kv_cache"}  # freed after every generate: nothing for a policy to move
    return held, movable


def _kv_reserved(run: Any) -> bool:
    backend = run.rollout.backend
    engines = registry.engine_names("generation")
    return backend in engines and registry.engine("generation", backend).kv_reserved


def _named_states(policy: OffloadPolicyConfig, resolved: OffloadPolicy) -> frozenset[str]:
    """The kinds a policy names on purpose: the aliases set true and a ``states`` list other
    than the default (every kind, which means "whatever the component holds")."""
    named = {_ALIASES[k] for k in _ALIASES if getattr(policy, k)}
    if list(policy.states) != list(STATE_KINDS):
        named |= set(policy.states)
    return resolved.states & frozenset(named)


def offload_problems(run: Any) -> Iterator[str]:
    """Offload policies that could move nothing, or not what they say: each with the key, the
    value and the fix.

    Refused: a policy (``when`` other than ``never``) for a component the placement does not
    place, or places only on nodes; state kinds the component does not hold; a policy that
    moves nothing (no kind it names is state the component keeps between stages); and, for a
    generation engine with a reserved KV cache (vLLM), ``kv_cache`` without ``weights``: the
    engine frees its cache only by sleeping, which takes the weights off the device too.

    Args:
        run: the run config.

    Yields:
        One message per problem.
    """
    placed = placed_components(run)
    on_nodes = {n.strip() for k in node_placement_keys(run) for n in k.split(",")}
    for name, raw in (run.placement.offload or {}).items():
        key = f"placement.offload.{name}"
        try:
            policy = policy_config(raw, key)
            resolved = resolve_offload(policy, key)
        except ConfigError:
            continue  # the placement check reports it
        if policy is None or resolved.when == "never":
            continue
        value = f"{key}={{when: {resolved.when}, states: {sorted(resolved.states)}}}"
        if name not in placed:
            yield (
                f"{value} is set but {name} is not placed (placement.component_placement places "
                f"{sorted(placed)}): drop {key}, or place {name}"
            )
        elif name in on_nodes:
            yield (
                f"{value} is set but {name} is placed on nodes only and holds no device memory: "
                f"drop {key}"
            )
        else:
            yield from _state_problems(run, name, policy, resolved, value)


def _state_problems(
    run: Any, name: str, policy: OffloadPolicyConfig, resolved: OffloadPolicy, value: str
) -> Iterator[str]:
    """A placed component's policy against the state kinds it holds (see
    :func:`offload_problems`)."""
    key = f"placement.offload.{name}"
    states = held_states(run, name)
    if states is None:
        return
    held, movable = states
    lacking = sorted(_named_states(policy, resolved) - held)
    if lacking:
        yield (
            f"{key} names state kinds {lacking} that {name} does not hold (it holds "
            f"{sorted(held) or 'none'}): drop them from {key}.states (or set the offload_* "
            f"alias that names them false)"
        )
    elif not resolved.states & movable:
        why = (
            f"rollout.backend={run.rollout.backend!r} frees its KV cache after every generate"
            if resolved.states & held
            else f"{name} holds {sorted(held) or 'none'}"
        )
        yield (
            f"{value} moves nothing ({why}): list {sorted(movable) or 'a kind it holds'} in "
            f"{key}.states, or drop {key}"
        )
    elif "kv_cache" in resolved.states & movable and "weights" not in resolved.states:
        yield (
            f"{value} with rollout.backend={run.rollout.backend!r}: the engine frees its KV "
            f"cache only by sleeping, which takes the weights off the device too, so the policy "
            f"would move weights it says stay: add weights to {key}.states (RLinf: "
            f"{key}.offload_weight=true), or drop kv_cache to keep both"
        )


@check
def _offload(cfg: RunConfig) -> Iterator[str]:
    yield from offload_problems(cfg)
