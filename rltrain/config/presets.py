"""Refuse a command line that chooses a config group the chosen preset also writes.

A preset (``experiment=<name>``, a ``_global_`` config) is merged after the config groups, so
its body wins over any group option: ``experiment=reasoning_ppo_hybrid placement=collocated``
would compose a hybrid placement under the name collocated, and
``experiment=gsm8k_tiny model=qwen2_0_5b`` a model mixed from both. Such a command is refused
before anything starts, naming the preset, the group choice and the fix. A group the preset does
not write (``experiment=gsm8k_tiny cluster=ray``) is accepted. A group the preset chooses in its
defaults list (``override /algorithm: ppo`` in ``reasoning_ppo``) counts as written: another
option on the command line would replace that choice while the rest of the preset (its critic
placement) stays written for it; the preset's own option is accepted.

The preset is read through Hydra's config loader (its defaults list and its config repository),
so presets and groups contributed by ``rltrain.conf`` entry-point packages are covered, and so is
everything a preset pulls in through its own defaults list (``_cartpole`` for the cartpole
presets).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from rltrain.errors import ConfigError

#: The config group whose options are presets.
PRESET_GROUP = "experiment"


def written_keys(node: Any, prefix: str = "") -> list[str]:
    """The dotted keys of every value a config body sets.

    Args:
        node: a config body as plain containers (mappings nest; anything else is a value).
        prefix: the body's package (``""`` for ``_global_``).

    Returns:
        The full keys, in the body's order (an empty mapping counts as a value: it replaces).
    """
    if isinstance(node, Mapping) and node:
        keys: list[str] = []
        for key, value in node.items():
            keys += written_keys(value, f"{prefix}.{key}" if prefix else str(key))
        return keys
    return [prefix] if prefix else []


def overlapping(package: str, keys: Sequence[str]) -> list[str]:
    """The keys that write into ``package`` (or replace a node above it).

    Args:
        package: a group's package, dotted (``placement``, ``whatif.devices``).
        keys: dotted keys a preset sets.

    Returns:
        The keys of ``keys`` inside ``package``, or above it, in their order.
    """
    return [
        k
        for k in keys
        if k == package or k.startswith(f"{package}.") or package.startswith(f"{k}.")
    ]


def preset_conflicts(
    config_loader: Any, config_name: str | None, overrides: Sequence[str]
) -> list[str]:
    """Say, for each group chosen in ``overrides`` that the chosen preset also writes, why.

    Args:
        config_loader: Hydra's config loader of the app (``GlobalHydra.instance().config_loader()``
            in a task function, ``hydra_context.config_loader`` in a launcher).
        config_name: the primary config's name.
        overrides: the job's command-line overrides (a sweep job's own, one value each).

    Returns:
        One message per conflicting group choice; empty when there is none or no preset.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    named = [o for o in parsed if not o.is_delete() and isinstance(o.value(), str)]
    presets = [f"{PRESET_GROUP}/{o.value()}" for o in named if o.key_or_group == PRESET_GROUP]
    preset = presets[-1] if presets else None
    repo = config_loader.repository
    choices = [
        o
        for o in named
        if o.key_or_group.split("/")[0] not in ("hydra", PRESET_GROUP)
        and repo.group_exists(o.key_or_group)
    ]
    if preset is None or not choices:
        return []
    defaults = config_loader.compute_defaults_list(config_name, list(overrides), RunMode.RUN)
    in_preset = _within(preset, defaults.defaults)
    keys = [
        key
        for d in defaults.defaults
        if in_preset(d.config_path)
        for key in _body_keys(repo, d.config_path, d.package)
    ]
    chosen = _preset_choices(repo, defaults.defaults, in_preset)
    name = preset.split("/", 1)[1]
    problems = []
    for choice in choices:
        problem = _conflict(name, choice, chosen, defaults.defaults, in_preset, keys, repo)
        if problem:
            problems.append(problem)
    return problems


def _conflict(
    name: str,
    choice: Any,
    chosen: dict[str, str | None],
    defaults: Sequence[Any],
    in_preset: Any,
    keys: list[str],
    repo: Any,
) -> str | None:
    """Why the command line's group ``choice`` conflicts with preset ``name``, or None: the
    preset writes keys of the group, or chooses another of its options itself."""
    group, option = _group_key(choice), choice.value()
    if group in chosen and chosen[group] == option:
        return None  # the preset's own choice: the job composes as without it
    written = _written_over(choice, defaults, in_preset, keys, repo)
    if written:
        return _message(name, f"{group}={option}", written)
    if group in chosen:
        return _choice_message(name, f"{group}={option}", chosen[group])
    return None


def _preset_choices(repo: Any, defaults: Sequence[Any], in_preset: Any) -> dict[str, str | None]:
    """The group options the preset's defaults lists choose (``override /algorithm: ppo``), by
    override key. A command-line choice of the same group replaces them, leaving the rest of
    the preset (``reasoning_ppo``'s critic placement) written for an option the job lacks."""
    from hydra.core.default_element import GroupDefault

    chosen: dict[str, str | None] = {}
    for d in defaults:
        if d.config_path is None or not in_preset(d.config_path):
            continue
        loaded = repo.load_config(d.config_path)
        entries = (loaded.defaults_list or []) if loaded is not None else []
        for entry in entries:
            if isinstance(entry, GroupDefault) and entry.is_override() and entry.is_name():
                entry = copy.copy(entry)  # the repository may cache what it loaded
                entry.update_parent(d.config_path.rpartition("/")[0], d.package or "")
                chosen[entry.get_override_key()] = entry.get_name()
    return chosen


def _written_over(
    choice: Any, defaults: Sequence[Any], in_preset: Any, keys: Sequence[str], repo: Any
) -> list[str]:
    """The preset's ``keys`` that land on what the group ``choice`` chose."""
    key = _group_key(choice)
    chosen = next(
        (d for d in defaults if d.override_key == key and not in_preset(d.config_path)), None
    )
    if chosen is None or chosen.package is None:
        return []
    if chosen.package:
        return overlapping(chosen.package, keys)
    own = _body_keys(repo, chosen.config_path, "")  # an option of the _global_ package
    return [k for k in keys if any(overlapping(o, [k]) for o in own)]


def _within(preset: str, defaults: Sequence[Any]) -> Any:
    """A test of whether a config of the defaults list is ``preset`` or pulled in by it."""
    parents = {d.config_path: d.parent for d in defaults if d.config_path is not None}

    def in_preset(path: str | None) -> bool:
        seen: set[str] = set()
        while path is not None and path not in seen:
            if path == preset:
                return True
            seen.add(path)
            path = parents.get(path)
        return False

    return in_preset


def _body_keys(repo: Any, config_path: str | None, package: str | None) -> list[str]:
    """The full keys a config of the repository sets (its defaults list left out)."""
    from omegaconf import OmegaConf

    loaded = repo.load_config(config_path) if config_path is not None else None
    if loaded is None:
        return []
    body = OmegaConf.to_container(loaded.config, resolve=False)
    if isinstance(body, Mapping):
        body = {k: v for k, v in body.items() if k != "defaults"}
    return written_keys(body, package or "")


def _group_key(override: Any) -> str:
    """``group`` or ``group@package``, as Hydra keys an override of a group default."""
    return (
        f"{override.key_or_group}@{override.package}"
        if override.package is not None
        else override.key_or_group
    )


def _message(preset: str, choice: str, written: Sequence[str]) -> str:
    shown = ", ".join(written[:3]) + (f" and {len(written) - 3} more" if len(written) > 3 else "")
    return (
        f"{PRESET_GROUP}={preset} sets {shown} itself, after the config groups, so {choice} on "
        f"the command line would be silently overridden by the preset: drop {choice}, or "
        f"override single keys instead (e.g. {written[0]}=...)"
    )


def _choice_message(preset: str, choice: str, option: str | None) -> str:
    group = choice.split("=", 1)[0]
    return (
        f"{PRESET_GROUP}={preset} chooses {group}: {option} in its defaults list and writes the "
        f"rest for it, so {choice} on the command line would replace that choice under the "
        f"preset: drop {choice}, or override single keys instead (e.g. {group.split('@')[0]}."
        f"<key>=...), or leave the preset out"
    )


def check_group_choices(
    config_loader: Any, config_name: str | None, overrides: Sequence[str]
) -> None:
    """Refuse a job whose command line chooses a group the chosen preset writes.

    Args:
        config_loader: see :func:`preset_conflicts`.
        config_name: the primary config's name.
        overrides: the job's command-line overrides.

    Raises:
        ConfigError: naming the preset, each conflicting group choice and the fix.
    """
    problems = preset_conflicts(config_loader, config_name, overrides)
    if problems:
        raise ConfigError(problems)
