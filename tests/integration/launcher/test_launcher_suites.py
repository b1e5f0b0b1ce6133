"""Hydra's own launcher conformance suites, run against ``hydra/launcher=rltrain``.

Hydra's test apps are not rltrain runs: they run as jobs that need no devices. ~2.5 minutes.
"""

from __future__ import annotations

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def _fresh_version_base():
    """Start each suite test with Hydra's version base unset, as a fresh process has it.

    Hydra keeps the version base in a process-wide singleton, and launchers hand the launching
    process's singleton state to their jobs (the basic launcher by running in-process, ours by
    sending it to the job's driver). An earlier test of this pytest process that composed with
    ``version_base="1.3"`` would otherwise turn off the working-directory change these suite
    apps (``version_base=None``) expect.
    """
    from hydra.version import _UNSPECIFIED_, VersionBase

    base = VersionBase.instance()
    saved = base.version_base
    base.version_base = _UNSPECIFIED_
    yield
    base.version_base = saved


@pytest.fixture(autouse=True)
def _connected(ray_address: str) -> None:
    """In-process sweeps reuse the session's Ray (already connected in this process)."""


@pytest.mark.parametrize("launcher_name, overrides", [("rltrain", [])])
class TestRltrainLauncher(LauncherTestSuite):
    pass


@pytest.fixture
def task_launcher_cfg() -> dict:
    return {}


@pytest.fixture
def extra_flags(join_flag: str) -> list[str]:
    return ["-m", "hydra/launcher=rltrain", join_flag]


class TestRltrainLauncherIntegration(IntegrationTestSuite):
    pass
