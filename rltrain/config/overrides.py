"""Command-line overrides whose meaning Hydra's merge would change.

``placement.offload={}`` reads as "no offload policies", but Hydra merges a mapping given on the
command line into the one the preset composed, and merging an empty mapping keeps every entry:
the shipped policies would stay. :func:`apply_empty_mappings` makes ``key={}`` empty the mapping,
for any key that holds one, and keeps command-line order: what a later override sets inside that
key (``placement.offload.actor=...``) is set again after the emptying. No Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf


def apply_empty_mappings(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """Empty every mapping the overrides set to ``{}``, in command-line order.

    An override inside an emptied mapping given after the ``{}`` (``placement.offload={}
    placement.offload.actor={when: after_stage}``) is applied again, so it holds what it set;
    one given before the ``{}`` stays emptied, as it would if Hydra applied ``{}`` as a
    replacement.

    Args:
        cfg: the composed config (changed in place).
        overrides: the job's overrides as given (``HydraConfig.get().overrides.task``).

    Returns:
        The keys that were emptied.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    emptied: list[str] = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_delete() or override.is_sweep_override():
            continue
        key = override.key_or_group
        value = override.value()
        if value == {} and isinstance(OmegaConf.select(cfg, key), DictConfig):
            OmegaConf.update(cfg, key, {}, merge=False)
            if key not in emptied:
                emptied.append(key)
        elif _inside(key, emptied):
            # Hydra merged it before the emptying threw it away: set it again. A key the
            # emptying removed is added back, as a replacement mapping would take it.
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    return emptied


def _inside(key: str, emptied: list[str]) -> bool:
    return any(key == e or key.startswith(e + ".") for e in emptied)
