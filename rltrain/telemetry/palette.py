"""One colour per component, for every picture rltrain draws (plan SVG, timeline PNG).

Known components have fixed colours, so pictures of different runs and of the plan and the run
compare at a glance; other names take colours from a short list in a stable order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: Fixed colours of the known components (and of the driver's lane in timelines).
COMPONENT_COLORS: Mapping[str, str] = {
    "actor": "#1f77b4",
    "rollout": "#ff7f0e",
    "reference": "#2ca02c",
    "reward": "#d62728",
    "critic": "#9467bd",
    "inference": "#8c564b",
    "env": "#e377c2",
    "driver": "#7f7f7f",
}
_EXTRA_COLORS = ("#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896")


def component_color(component: str, others: Sequence[str] = ()) -> str:
    """The colour of a component: fixed for known ones, else by its place among ``others``.

    Args:
        component: the component's name.
        others: every component of the picture (unknown ones are coloured in sorted order).

    Returns:
        A ``#rrggbb`` colour.
    """
    if component in COMPONENT_COLORS:
        return COMPONENT_COLORS[component]
    extra = sorted(c for c in others if c not in COMPONENT_COLORS)
    i = extra.index(component) if component in extra else len(extra)
    return _EXTRA_COLORS[i % len(_EXTRA_COLORS)]
