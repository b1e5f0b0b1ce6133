"""Hydra's own launcher conformance suites, run against ``hydra/launcher=rltrain``.

Hydra's test apps are not rltrain runs: they run as jobs that need no devices. ~2.5 minutes.
"""

from __future__ import annotations

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

pytestmark = pytest.mark.timeout(600)


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
