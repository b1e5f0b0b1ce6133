"""The registry: every kind by name. Read it; do not test names.

The built-in entries are registered below; a new kind is its module plus one
:func:`register` call (tests register toy kinds inside :func:`registered`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rltrain.errors import ConfigError
from rltrain.kinds import components, engines, runners, vllm
from rltrain.kinds.records import ENGINE_KEYS, ComponentKind, EngineKind, RunnerKind

Kind = EngineKind | ComponentKind | RunnerKind

_ENGINES: dict[tuple[str, str], EngineKind] = {}
_COMPONENTS: dict[str, ComponentKind] = {}
_RUNNERS: dict[str, RunnerKind] = {}


def register(kind: Kind) -> Kind:
    """Add a kind (an engine under its role and name, a component or runner under its name).

    Raises:
        ValueError: a kind of that name is already registered.
    """
    if isinstance(kind, EngineKind):
        _add(_ENGINES, (kind.role, kind.name), kind)
    elif isinstance(kind, ComponentKind):
        _add(_COMPONENTS, kind.name, kind)
    else:
        _add(_RUNNERS, kind.name, kind)
    return kind


def _add(table: dict[Any, Any], key: Any, kind: Kind) -> None:
    if key in table:
        raise ValueError(f"{type(kind).__name__} {key!r} is already registered")
    table[key] = kind


def unregister(kind: Kind) -> None:
    """Remove a kind :func:`register` added."""
    if isinstance(kind, EngineKind):
        del _ENGINES[(kind.role, kind.name)]
    elif isinstance(kind, ComponentKind):
        del _COMPONENTS[kind.name]
    else:
        del _RUNNERS[kind.name]


@contextmanager
def registered(*kinds: Kind) -> Iterator[None]:
    """Kinds registered for the length of a ``with`` block (tests, experiments)."""
    for k in kinds:
        register(k)
    try:
        yield
    finally:
        for k in kinds:
            unregister(k)


def engine_names(role: str, having: str | None = None) -> tuple[str, ...]:
    """The allowed values of the role's key (``actor.backend``: training, ``rollout.backend``:
    generation), in registration order; with ``having``, only the engines whose entry sets
    that property (``segments``, ``multi_turn``, ...)."""
    return tuple(
        name
        for (r, name), kind in _ENGINES.items()
        if r == role and (having is None or getattr(kind, having))
    )


def engine(role: str, name: str) -> EngineKind:
    """The engine a key names.

    Raises:
        ConfigError: no engine of that role has that name (naming the key and the choices).
    """
    try:
        return _ENGINES[(role, name)]
    except KeyError:
        key = ENGINE_KEYS[role]
        raise ConfigError(
            f"{key}={name!r} is not valid: choose one of {list(engine_names(role))}"
        ) from None


def training_engine(run: Any) -> EngineKind:
    """The engine ``actor.backend`` names."""
    return engine("training", run.actor.backend)


def generation_engine(run: Any) -> EngineKind:
    """The engine ``rollout.backend`` names."""
    return engine("generation", run.rollout.backend)


def component_names() -> tuple[str, ...]:
    """The components a placement may name."""
    return tuple(_COMPONENTS)


def component(name: str) -> ComponentKind:
    """A component by name.

    Raises:
        KeyError: no component of that name.
    """
    return _COMPONENTS[name]


def weight_receivers() -> tuple[str, ...]:
    """The components that take the actor's weight versions: those whose entry says
    ``receives_weights``, in registration order (a placement need not place them all).

    Returns:
        Their names (``rollout``, ``inference`` and any registered since).
    """
    return tuple(n for n, c in _COMPONENTS.items() if c.receives_weights)


def runner_names() -> tuple[str, ...]:
    """The allowed values of ``runner``."""
    return tuple(_RUNNERS)


def runner(name_or_run: Any) -> RunnerKind:
    """The runner kind a name, or a run config's ``runner``, names.

    Raises:
        ConfigError: no runner kind of that name.
    """
    name = name_or_run if isinstance(name_or_run, str) else name_or_run.runner
    try:
        return _RUNNERS[name]
    except KeyError:
        raise ConfigError(
            f"runner={name!r} is not valid: choose one of {list(runner_names())}"
        ) from None


for _kind in (
    engines.TORCH_TRAINING,
    engines.DEEPSPEED,
    engines.TORCH_GENERATION,
    vllm.VLLM,
    components.ACTOR,
    components.ROLLOUT,
    components.REFERENCE,
    components.REWARD,
    components.CRITIC,
    components.TOOLS,
    components.INFERENCE,
    components.ENV,
    runners.REASONING,
    runners.EMBODIED,
):
    register(_kind)
