"""One ``RLTRAIN_CACHE`` for a whole test run: a generated data set and warm-start checkpoint
that several tests read as shipped is generated once, not once per test.

Both test processes (pytest-xdist) share it: it sits beside their temporary directories, and
the generators take turns under their own file lock (``rltrain.tasks.generated``), so a test
that finds the other process generating waits for it and then reads the same files. The
generators' stamp records every setting and the absolute paths, so a test gets the cache only
when its config is the one that wrote it; any other config regenerates.

Only the presets in :data:`SHARED`, with their shipped settings, go here: those
``test_doc_commands`` generates before its first test, so no test writes into the shared
cache while it checks that a plan leaves the cache untouched. A test with other settings,
or whose subject is the generator, uses a cache of its own.
"""

from __future__ import annotations

import os
import pathlib

import pytest

#: The presets whose shipped data and checkpoint the shared cache holds.
SHARED = ("gsm8k_tiny",)


def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The run's shared cache directory (made on first use).

    Under xdist each test process has its own base temporary directory inside the run's; the
    cache goes in the run's, which both see. In one process (``-n 0``) it goes in its own.
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "rltrain-cache"
    path.mkdir(exist_ok=True)
    return path


def prepare_shared(cache: pathlib.Path, conf: pathlib.Path) -> None:
    """Generate (or wait for, or find current) every preset of :data:`SHARED` in ``cache``,
    as ``python -m rltrain experiment=NAME`` does before Ray starts.

    Args:
        cache: :func:`shared_cache`.
        conf: the repository's ``conf`` directory.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rltrain.config import load_config
    from rltrain.config.store import register_configs
    from rltrain.tasks import prepare_task

    before = os.environ.get("RLTRAIN_CACHE")
    os.environ["RLTRAIN_CACHE"] = str(cache)  # resolved by load_config (task.params.data_dir)
    try:
        for name in SHARED:
            register_configs()
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
                cfg = compose(config_name="config", overrides=[f"experiment={name}"])
            prepare_task(load_config(cfg))
    finally:
        if before is None:
            os.environ.pop("RLTRAIN_CACHE", None)
        else:
            os.environ["RLTRAIN_CACHE"] = before
