"""A Hydra SearchPathPlugin: rltrain's config groups in any Hydra app, plus users' additions.

Hydra runs every installed SearchPathPlugin for every app. This one appends (so an app's own
configs always win over ours):

1. rltrain's configs, ``pkg://rltrain.conf`` (from a source checkout: the ``conf/`` directory),
   so a user's own ``@hydra.main`` app can compose ``placement=hybrid``, ``cluster=local``,
   ``model=tiny_llama`` ... and type its nodes with the schemas of ``rltrain_schema/``.
2. Config directories that installed packages declare under the ``rltrain.conf`` entry point
   group, so a user's package adds placements, tasks and models to ``python -m rltrain``::

       # the user's pyproject.toml; mypkg/conf/placement/my_layout.yaml then works as
       # `python -m rltrain placement=my_layout`
       [project.entry-points."rltrain.conf"]
       mypkg = "mypkg.conf"

Import-light: no rltrain module is imported; packages are located with ``importlib.util``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from importlib.metadata import entry_points

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

log = logging.getLogger(__name__)

#: Entry point group through which installed packages add config directories.
ENTRY_POINT_GROUP = "rltrain.conf"


def _package_dir(package: str) -> str | None:
    """The directory of an importable package, without importing the package itself."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def rltrain_config_path() -> str | None:
    """Where rltrain's config groups are: ``pkg://rltrain.conf`` when installed as a package,
    ``file://<checkout>/conf`` in an editable install (where ``rltrain.conf`` is not a package),
    None when neither exists."""
    if _package_dir("rltrain.conf") is not None:
        return "pkg://rltrain.conf"
    rltrain_dir = _package_dir("rltrain")
    if rltrain_dir is None:
        return None
    conf = os.path.join(os.path.dirname(rltrain_dir), "conf")
    return f"file://{conf}" if os.path.isfile(os.path.join(conf, "config.yaml")) else None


def contributed_config_paths() -> list[str]:
    """``pkg://`` paths of the config packages declared under :data:`ENTRY_POINT_GROUP`."""
    paths = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        package = ep.value.strip()
        if _package_dir(package) is None:
            log.warning(
                "entry point %s = %r (group %r) names no importable package: skipped",
                ep.name,
                package,
                ENTRY_POINT_GROUP,
            )
            continue
        paths.append(f"pkg://{package}")
    return paths


class RltrainSearchPathPlugin(SearchPathPlugin):
    """Appends rltrain's configs and users' contributed config packages to every app."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Append the paths (Hydra calls this while building an app's search path).

        Args:
            search_path: the app's search path, modified in place.
        """
        own = rltrain_config_path()
        known = {entry.path for entry in search_path.get_path()}
        if own is not None and own not in known:
            search_path.append(provider="rltrain", path=own)
        for path in contributed_config_paths():
            if path not in known:
                search_path.append(provider="rltrain-user", path=path)
