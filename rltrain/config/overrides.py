"""Command-line overrides whose meaning Hydra's merge would change.

``placement.offload={}`` reads as "no offload policies", but Hydra merges a mapping given on the
command line into the one the preset composed, and merging an empty mapping keeps every entry:
the shipped policies would stay. :func:`apply_empty_mappings` makes ``key={}`` empty the mapping,
for any key that holds one. No Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf


def apply_empty_mappings(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """Empty every mapping the overrides set to ``{}``.

    Args:
        cfg: the composed config (changed in place).
        overrides: the job's overrides as given (``HydraConfig.get().overrides.task``).

    Returns:
        The keys that were emptied.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    emptied = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_delete() or override.is_sweep_override():
            continue
        key = override.key_or_group
        value = override.value()
        if value != {} or not isinstance(OmegaConf.select(cfg, key), DictConfig):
            continue
        OmegaConf.update(cfg, key, {}, merge=False)
        emptied.append(key)
    return emptied
