"""A Hydra SearchPathPlugin: users' config packages in ``python -m rltrain``.

Hydra runs every installed SearchPathPlugin for every app. This one changes only rltrain's own
app (the one whose primary config is rltrain's, see :func:`is_rltrain_app`): it appends the
config directories that installed packages declare under the ``rltrain.conf`` entry point
group, so a user's package adds placements, tasks and models to ``python -m rltrain``::

    # the user's pyproject.toml; mypkg/conf/placement/my_layout.yaml then works as
    # `python -m rltrain placement=my_layout`
    [project.entry-points."rltrain.conf"]
    mypkg = "mypkg.conf"

They are appended, so rltrain's shipped options win: a contributed file with the name of a
shipped one (``placement/hybrid.yaml``) is never used, and a warning says so.

Any other Hydra app keeps its own composition. One that wants rltrain's config groups says so
in its primary config, with Hydra's own ``hydra.searchpath`` (docs/launcher.md).

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


def local_dir(path: str) -> str | None:
    """The directory a search-path entry names (``pkg://``, ``file://`` or a plain path; None
    for a package that cannot be found or another scheme)."""
    if path.startswith("pkg://"):
        return _package_dir(path[len("pkg://") :].replace("/", "."))
    if path.startswith("file://"):
        path = path[len("file://") :]
    return path if "://" not in path else None


def is_rltrain_app(search_path: ConfigSearchPath) -> bool:
    """Whether the app's primary config directory (the ``main`` entry) is rltrain's.

    Args:
        search_path: the app's search path.

    Returns:
        True for ``python -m rltrain`` and any app whose ``config_path`` is rltrain's configs.
    """
    own = rltrain_config_path()
    own_dir = local_dir(own) if own is not None else None
    for entry in search_path.get_path():
        if entry.provider != "main" or entry.path is None:
            continue
        if entry.path == own:
            return True
        main_dir = local_dir(entry.path)
        if own_dir is not None and main_dir is not None:
            return os.path.realpath(main_dir) == os.path.realpath(own_dir)
    return False


def shadowed_options(contributed: str) -> list[str]:
    """The options of a contributed config package that rltrain ships under the same name.

    Args:
        contributed: a ``pkg://`` path from :func:`contributed_config_paths`.

    Returns:
        ``group/name.yaml`` paths found in both, sorted.
    """
    own = rltrain_config_path()
    own_dir = local_dir(own) if own is not None else None
    theirs = local_dir(contributed)
    if own_dir is None or theirs is None:
        return []
    found = []
    for folder, _dirs, files in os.walk(theirs):
        rel = os.path.relpath(folder, theirs)
        if rel == ".":
            continue  # a primary config of theirs is not an option of a group
        for name in files:
            option = os.path.join(rel, name)
            if name.endswith(".yaml") and os.path.isfile(os.path.join(own_dir, option)):
                found.append(option.replace(os.sep, "/"))
    return sorted(found)


class RltrainSearchPathPlugin(SearchPathPlugin):
    """Appends users' contributed config packages to rltrain's own app, and to no other."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Append the paths (Hydra calls this while building an app's search path).

        Args:
            search_path: the app's search path, modified in place.
        """
        if not is_rltrain_app(search_path):
            return
        known = {entry.path for entry in search_path.get_path()}
        for path in contributed_config_paths():
            if path in known:
                continue
            search_path.append(provider="rltrain-user", path=path)
            for option in shadowed_options(path):
                log.warning(
                    "%s/%s is not used: rltrain ships an option of that name, which wins; "
                    "rename the file (e.g. %s_mine.yaml) to choose it",
                    path,
                    option,
                    option[: -len(".yaml")],
                )
