"""Model-building fields set beside ``model.path`` must describe the checkpoint.

A checkpoint is loaded as saved, so ``model.path=<ckpt> model.hidden_size=128`` would train the
checkpoint's own width while the config says 128: refused, naming the key, both values and the
fix. Fields at their defaults, or equal to the checkpoint's, pass.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from model_configs import QWEN25_05B
from omegaconf import OmegaConf

from rltrain.config.files import built_field_problems
from rltrain.config.schema import ModelConfig
from rltrain.config.store import register_configs

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"
DEFAULTS = vars(ModelConfig())
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 128,
    "vocab_size": 40,
}


def _checkpoint(tmp_path: pathlib.Path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def _model(*overrides: str) -> dict:
    """The composed ``model`` section of a command line, as plain values."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg.model, resolve=True)


def test_a_size_set_beside_a_checkpoint_that_differs_is_refused(tmp_path):
    path = _checkpoint(tmp_path, TINY_LLAMA)
    (problem,) = built_field_problems(path, _model("model.hidden_size=128"), DEFAULTS)
    assert "model.hidden_size=128" in problem and "hidden_size=32" in problem
    assert f"model.path={path!r}" in problem
    assert "Set model.hidden_size=32 (or drop it if you set it)" in problem


def test_a_model_option_describing_another_checkpoint_is_refused_field_by_field(tmp_path):
    problems = built_field_problems(
        _checkpoint(tmp_path, TINY_LLAMA), _model("model=qwen2_0_5b"), DEFAULTS
    )
    text = "\n".join(problems)
    assert "model.family='qwen2'" in text and "model_type='llama'" in text
    for key in ("hidden_size=896", "num_layers=24", "vocab_size=151936", "num_heads=14"):
        assert f"model.{key}" in text
    # num_kv_heads=2 matches: a config.json without num_key_value_heads has as many as heads
    assert "num_kv_heads" not in text
    assert "tie_word_embeddings" not in text  # the checkpoint does not say: nothing to compare


def test_an_option_describing_its_checkpoint_passes(tmp_path):
    assert (
        built_field_problems(
            _checkpoint(tmp_path, QWEN25_05B), _model("model=qwen2_0_5b"), DEFAULTS
        )
        == []
    )


def test_the_defaults_pass_beside_any_checkpoint(tmp_path):
    assert built_field_problems(_checkpoint(tmp_path, TINY_LLAMA), _model(), DEFAULTS) == []
    assert built_field_problems(_checkpoint(tmp_path, QWEN25_05B), _model(), DEFAULTS) == []


def test_gsm8k_tiny_with_your_own_checkpoint_passes(tmp_path):
    # docs/data.md's command: the preset sizes the model it generates (max_position_embeddings
    # 256, family qwen2); a Qwen2.5 checkpoint in its place covers that context
    fields = _model("experiment=gsm8k_tiny", "task.generate=null")
    assert fields["max_position_embeddings"] == 256
    assert built_field_problems(_checkpoint(tmp_path, QWEN25_05B), fields, DEFAULTS) == []


def test_more_positions_than_the_checkpoint_has_are_refused(tmp_path):
    fields = _model("model.max_position_embeddings=100000")
    (problem,) = built_field_problems(_checkpoint(tmp_path, QWEN25_05B), fields, DEFAULTS)
    assert "model.max_position_embeddings=100000" in problem and "=32768" in problem


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_an_unreadable_config_json_is_left_to_the_checkpoint_check(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    assert built_field_problems(str(tmp_path), _model("model.hidden_size=128"), DEFAULTS) == []
