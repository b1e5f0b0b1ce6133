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


FOREIGN_APP = """
import hydra
from omegaconf import OmegaConf

from rltrain.config.store import register_configs

register_configs()  # rltrain_schema/... (typing with rltrain's schemas) needs it


@hydra.main(version_base="1.3", config_path=".", config_name="config")
def main(cfg):
    print("TYPE", OmegaConf.get_type(cfg, "placement").__name__)
    print("CFG", OmegaConf.to_container(cfg))

main()
"""


def _foreign_app(tmp_path, config: str):
    (tmp_path / "config.yaml").write_text(config)
    (tmp_path / "app.py").write_text(FOREIGN_APP)
    return tmp_path / "app.py"


def test_another_apps_composition_is_its_own(tmp_path):
    # No placement/hybrid.yaml of its own: rltrain's must not be found for it.
    app = _foreign_app(tmp_path, "defaults:\n  - placement: hybrid\n")
    out = subprocess.run(
        [sys.executable, str(app), "hydra.run.dir=."],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "Could not find 'placement/hybrid'" in out.stderr
    # Its own groups list only its own options (`--help` shows them).
    (tmp_path / "config.yaml").write_text("foo: 1\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("name: mine\n")
    help_page = _run([str(app), "--help"], cwd=tmp_path).stdout
    assert "model: mine" in help_page and "tiny_llama" not in help_page
    assert "placement:" not in help_page and "hybrid" not in help_page
    # And an app without a primary config of its own does not get rltrain's.
    (tmp_path / "config.yaml").unlink()
    out = subprocess.run(
        [sys.executable, str(app), "hydra.run.dir=."],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0 and "Cannot find primary config 'config'" in out.stderr


def test_another_app_opts_in_with_hydra_searchpath(tmp_path):
    from hydra_plugins.rltrain_launcher.rltrain_search_path import rltrain_config_path

    app = _foreign_app(
        tmp_path,
        "defaults:\n  - rltrain_schema/placement@placement\n  - placement: hybrid\n"
        "  - cluster: local\n  - _self_\n"
        f"hydra:\n  searchpath:\n    - {rltrain_config_path()}\n",
    )
    out = _run([str(app), "hydra.run.dir=."], cwd=tmp_path).stdout
    assert "TYPE PlacementConfig" in out  # typed by rltrain's schema
    assert "'mode': 'hybrid'" in out and "'devices_per_node': 2" in out


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
    # --help lists it beside the shipped placements.
    help_page = _run(["-m", "rltrain", "--help"], cwd=tmp_path, env=env).stdout
    line = next(ln for ln in help_page.splitlines() if ln.strip().startswith("placement "))
    assert "swapped" in line and "hybrid" in line


def test_a_contributed_option_named_like_a_shipped_one_is_warned_about(user_package, tmp_path):
    conf = user_package / "mypkg" / "conf" / "placement"
    (conf / "hybrid.yaml").write_text((conf / "swapped.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": str(user_package)}
    out = _run(["-m", "rltrain", "--cfg", "job", "placement=hybrid"], cwd=tmp_path, env=env)
    assert "mode: hybrid" in out.stdout  # the shipped one wins
    assert "pkg://mypkg.conf/placement/hybrid.yaml is not used" in out.stderr
    assert "placement/hybrid_mine.yaml" in out.stderr


def test_the_launcher_runs_another_apps_jobs_with_a_trainer_section(tmp_path, join_flag):
    # Sections named like rltrain's (cluster, placement, trainer) do not make a job rltrain's.
    (tmp_path / "config.yaml").write_text(
        "cluster: {nodes: 1}\nplacement: {mode: mine}\ntrainer: {epochs: 3}\n"
    )
    (tmp_path / "app.py").write_text(
        textwrap.dedent(
            """
            import hydra

            @hydra.main(version_base="1.3", config_path=".", config_name="config")
            def main(cfg):
                print("EPOCHS", cfg.trainer.epochs)
                return float(cfg.trainer.epochs)

            main()
            """
        )
    )
    out = _run(
        [str(tmp_path / "app.py"), "-m", "trainer.epochs=3,4", "hydra/launcher=rltrain",
         f"hydra.sweep.dir={tmp_path / 'sweep'}", join_flag],
        cwd=tmp_path,
    )  # fmt: skip
    said = out.stdout + out.stderr
    assert "unknown config key" not in said and "failed" not in said
    assert (tmp_path / "sweep" / "sweep_report.md").read_text().count("| completed |") == 2
