"""The group builders of a runner's components, from the components' entries
(:mod:`rltrain.kinds.components`): which worker class, which layout fields, and when a run
builds the group at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rltrain.config.schema import RunConfig
from rltrain.kinds import registry
from rltrain.kinds.records import load

#: launched layout -> the component's worker-group builder.
Builder = Callable[[Any], Any]


def component_builders(run: RunConfig, runner: str) -> dict[str, Builder]:
    """component -> builder, for every component whose entry names a worker for ``runner``
    and that this run builds (``built_when``).

    Args:
        run: the checked run config.
        runner: the runner kind whose workers to build.

    Returns:
        Builders by component name; the job starts those its placement places.
    """
    out: dict[str, Builder] = {}
    for name in registry.component_names():
        kind = registry.component(name)
        path = kind.worker_path(runner, run)
        if path is None or (kind.built_when is not None and not kind.built_when(run)):
            continue
        out[name] = _builder(run, path, kind.layout_args)
    return out


def _builder(run: RunConfig, path: str, layout_args: tuple[str, ...]) -> Builder:
    def build(layout: Any) -> Any:
        return load(path).create_group(run, *(getattr(layout, a) for a in layout_args))

    return build
