"""The real entry point in a subprocess: overrides, bad input and exit codes."""

from __future__ import annotations

import pytest
from rltrain_cli import rltrain_cli as run_cli


def test_cfg_job_shows_the_chosen_placement(tmp_path):
    out = run_cli(
        "--cfg", "job", "placement=hybrid", "placement.component_placement.actor=0-1", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "mode: hybrid" in out.stdout
    assert "actor: 0-1" in out.stdout


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("placement=hybird", "hybrid"),  # the message lists the valid options
        ("cluster.num_nodes=two", "cluster.num_nodes"),
        ("+placement.colour=red", "placement.colour"),
        # read only with a KL term: the estimator's own check, not the unread-key refusal
        (
            "algorithm.kl_estimator=k9 algorithm.kl_coef=0.1 "
            "+placement.component_placement.reference=all",
            "algorithm.kl_estimator='k9' is not valid: choose one of ['k1', 'k2', 'k3']",
        ),
    ],
)
def test_bad_input_names_the_key_and_fails(override: str, expected: str, tmp_path):
    # in a directory of its own: Hydra names run directories to the second, and a refused run
    # removes its own, so two refused runs in one directory and second would race
    out = run_cli(*override.split(), cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_key_lists_the_known_ones(tmp_path):
    out = run_cli("+trainer.totl_steps=3", cwd=tmp_path)
    assert out.returncode == 2
    assert "total_steps" in out.stderr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.total_steps=[1,2", "could not read the command line"),
        ("trainer..x=1", "could not read the command line"),
        ("seed=" + "1" * 5000, "too long"),
        ("hydra.run.dir=/proc/no/such/dir", "hydra.run.dir"),
        ("cluster.devices_per_node=100000000", "beyond any real cluster"),
        ("cluster.device_memory_gib=nan", "cluster.device_memory_gib"),
        (
            "~trainer.total_steps",
            "~trainer.total_steps: TrainerConfig (DictConfig) does not support deletion",
        ),
    ],
)
def test_hydra_mistakes_are_clear_errors(override: str, expected: str, tmp_path):
    out = run_cli(override, "mode=plan", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in out.stderr
    assert "Traceback" not in out.stderr and "Error executing job" not in out.stderr


def test_a_refused_run_leaves_nothing_behind(tmp_path):
    out = run_cli("trainer.train_batch_size=3", cwd=tmp_path)
    assert out.returncode == 2 and "trainer.train_batch_size=3" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_refused_plan_keeps_its_drawing_and_logs_why(tmp_path):
    out = run_cli("mode=plan", "trainer.max_staleness=1", "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 2
    assert (tmp_path / "run" / "plan.json").exists()
    assert "max_staleness" in (tmp_path / "run" / "rltrain.log").read_text()


def test_help_lists_public_options_modes_and_subcommands():
    out = run_cli("--help")
    assert out.returncode == 0
    for text in ("placement", "hybrid", "cartpole_hybrid", "mode=plan", "bench", "trace"):
        assert text in out.stdout
    assert "_cartpole " not in out.stdout and "rltrain_schema" not in out.stdout


def test_version_is_rltraines():
    out = run_cli("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("rltrain 0.") and "hydra-core" in out.stdout


def test_a_value_of_the_wrong_type_is_named_with_a_fix(tmp_path):
    out = run_cli("mode=plan", "optimizer.betas=${seed}", cwd=tmp_path)
    assert out.returncode == 2
    assert "AnyNode" not in out.stderr
    assert "optimizer.betas=" in out.stderr and "e.g. optimizer.betas=[0.9,0.999]" in out.stderr


def test_a_type_error_comes_with_every_other_problem(tmp_path):
    out = run_cli("mode=plan", "cluster.num_nodes=two", "trainer.train_batch_size=3", cwd=tmp_path)
    assert out.returncode == 2
    assert "2 configuration problems" in out.stderr
    assert "cluster.num_nodes=two" in out.stderr and "trainer.train_batch_size=3" in out.stderr
    assert list(tmp_path.iterdir()) == []  # the second look wrote nothing


def test_an_empty_offload_mapping_lets_zero3_plan_on_the_default_placement(tmp_path):
    pytest.importorskip("deepspeed")
    zero3 = ("mode=plan", "actor.backend=deepspeed", "actor.zero_stage=3")
    refused = run_cli(*zero3, cwd=tmp_path)
    assert refused.returncode == 2 and "placement.offload.actor" in refused.stderr
    # ZeRO-3 runs on one actor rank (its gathered weight export needs every rank)
    out = run_cli(*zero3, "placement.offload={}", "cluster.devices_per_node=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (tmp_path / "two").mkdir()
    two = run_cli(*zero3, "placement.offload={}", cwd=tmp_path / "two")
    assert two.returncode == 2
    assert "actor.zero_stage=3 with 2 actor ranks" in two.stderr
    assert "use actor.zero_stage=2" in two.stderr
