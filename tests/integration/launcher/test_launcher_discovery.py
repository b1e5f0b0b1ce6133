"""Hydra finds the launcher and the search-path plugin; users' apps and packages use them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

ENTRY_MODULES = (
    "hydra_plugins.rltrain_launcher.rltrain_launcher",
    "hydra_plugins.rltrain_launcher.rltrain_search_path",
)


def _run(args: list[str], cwd=None, env=None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_hydra_discovers_both_plugins():
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    launchers = {c.__name__ for c in Plugins.instance().discover(Launcher)}
    search = {c.__name__ for c in Plugins.instance().discover(SearchPathPlugin)}
    assert {"RltrainLauncher", "RayLauncher"} <= launchers
    assert "RltrainSearchPathPlugin" in search


def test_declared_under_the_hydra_plugins_entry_point_group():
    declared = {ep.value for ep in entry_points(group="hydra.plugins")}
    assert set(ENTRY_MODULES) <= declared


def test_entry_modules_are_import_light():
    code = (
        "import sys;"
        + "".join(f"import {m};" for m in ENTRY_MODULES)
        + "print(sorted(m for m in ('ray', 'torch', 'rltrain', 'matplotlib') if m in sys.modules))"
    )
    assert _run(["-c", code]).stdout.strip() == "[]"


def test_cli_lists_the_plugin_and_sweeps_with_it_by_default():
    info = _run(["-m", "rltrain", "--info", "plugins"]).stdout
    assert "RltrainLauncher" in info and "RltrainSearchPathPlugin" in info
    hydra_cfg = _run(["-m", "rltrain", "--cfg", "hydra"]).stdout
    assert "_target_: hydra_plugins.rltrain_launcher.rltrain_launcher.RltrainLauncher" in hydra_cfg
    ray_cfg = _run(["-m", "rltrain", "--cfg", "hydra", "hydra/launcher=ray"]).stdout
    assert "_target_: hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher" in ray_cfg


def test_users_own_app_composes_rltrain_config_groups(tmp_path):
    (tmp_path / "app.yaml").write_text("defaults:\n  - placement: hybrid\n  - cluster: local\n")
    (tmp_path / "app.py").write_text(
        textwrap.dedent(
            """
            import hydra

            @hydra.main(version_base="1.3", config_path=".", config_name="app")
            def main(cfg):
                print("GOT", cfg.placement.mode, cfg.cluster.devices_per_node)

            main()
            """
        )
    )
    out = _run([str(tmp_path / "app.py"), "hydra.run.dir=."], cwd=tmp_path)
    assert "GOT hybrid 2" in out.stdout


@pytest.fixture
def user_package(tmp_path):
    """An installed package (a dist-info on PYTHONPATH) contributing a placement layout."""
    site = tmp_path / "site"
    conf = site / "mypkg" / "conf" / "placement"
    conf.mkdir(parents=True)
    (site / "mypkg" / "__init__.py").write_text("")
    (site / "mypkg" / "conf" / "__init__.py").write_text("")
    (conf / "swapped.yaml").write_text(
        "mode: disaggregated\ncomponent_placement:\n  actor: '1'\n  rollout: '0'\n"
        "  reward: {node_group: node, placement: '0'}\noffload: {}\n"
    )
    info = site / "mypkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rltrain.conf]\nmypkg = mypkg.conf\n")
    return site


def test_users_package_adds_a_placement_to_rltrain(user_package, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(user_package)}
    out = _run(["-m", "rltrain", "--cfg", "job", "placement=swapped"], cwd=tmp_path, env=env)
    assert "actor: '1'" in out.stdout and "rollout: '0'" in out.stdout
    assert "mode: disaggregated" in out.stdout
