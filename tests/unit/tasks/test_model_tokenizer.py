"""The built-in tokenizer and tiny model, and loading both back from Hugging Face files."""

from __future__ import annotations

import pathlib

import pytest
import torch

from rltrain.config.schema import ModelConfig
from rltrain.errors import ConfigError
from rltrain.tasks import build_char_tokenizer, build_tokenizer
from rltrain.tasks.model import build_model

SMALL = {"hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "num_kv_heads": 1}


def test_char_tokenizer_ids_padding_and_decode():
    tok = build_char_tokenizer("0123+=")
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert len(tok) == 9
    enc = tok(["1+2=", "3="], padding=True)
    assert enc["input_ids"] == [[4, 7, 5, 8], [0, 0, 6, 8]]  # '0' is id 3; left padding
    assert enc["attention_mask"] == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert tok.decode([4, 7, 5, 8]) == "1+2="
    assert tok("9")["input_ids"] == [2]  # unknown characters map to <unk>
    with pytest.raises(ConfigError, match="model.vocab_chars='aa'"):
        build_char_tokenizer("aa")


def test_every_line_break_is_one_token():
    tok = build_char_tokenizer("3\n")  # '3' is id 3, '\n' id 4
    assert tok("\n", add_special_tokens=False)["input_ids"] == [4]
    assert tok("3\n\n3", add_special_tokens=False)["input_ids"] == [3, 4, 4, 3]
    assert tok.decode([3, 4, 4, 3]) == "3\n\n3"
    assert tok("\r\n", add_special_tokens=False)["input_ids"] == [2, 4]  # '\r' unknown alone


def test_tokenizer_saves_and_loads_in_hf_format(tmp_path: pathlib.Path):
    tok = build_tokenizer(ModelConfig())
    tok.save_pretrained(tmp_path)
    loaded = build_tokenizer(ModelConfig(tokenizer_path=str(tmp_path)))
    assert loaded("12+3=")["input_ids"] == tok("12+3=")["input_ids"]
    assert loaded.padding_side == "left" and loaded.eos_token_id == tok.eos_token_id
    with pytest.raises(ConfigError, match="model.tokenizer_path='/no/such/dir'"):
        build_tokenizer(ModelConfig(tokenizer_path="/no/such/dir"))


def test_model_init_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = build_model(ModelConfig(init_seed=5, **SMALL))
    assert torch.equal(torch.get_rng_state(), state)
    b = build_model(ModelConfig(init_seed=5, **SMALL))
    c = build_model(ModelConfig(init_seed=6, **SMALL))
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert a.config.vocab_size == len(build_tokenizer(ModelConfig()))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_built_model_round_trips_through_model_path(tmp_path: pathlib.Path, family: str):
    cfg = ModelConfig(family=family, **SMALL)
    model, tok = build_model(cfg), build_tokenizer(cfg)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded_cfg = ModelConfig(path=str(tmp_path))
    loaded = build_model(loaded_cfg)
    assert type(loaded) is type(model)
    ids = build_tokenizer(loaded_cfg)("1+2=", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert build_model(loaded_cfg, dtype="bfloat16").dtype == torch.bfloat16


def test_bad_model_paths_name_the_key(tmp_path: pathlib.Path):
    with pytest.raises(ConfigError, match="model.path='/no/such/ckpt' does not exist"):
        build_model(ModelConfig(path="/no/such/ckpt"))
    with pytest.raises(ConfigError, match="has no config.json"):
        build_model(ModelConfig(path=str(tmp_path)))
    (tmp_path / "config.json").write_text('{"model_type": "not-a-model"}')
    with pytest.raises(ConfigError, match="not a loadable causal-LM checkpoint"):
        build_model(ModelConfig(path=str(tmp_path)))
    with pytest.raises(ConfigError, match="model.path=.*tokenizer"):
        build_tokenizer(ModelConfig(path=str(tmp_path)))
    with pytest.raises(ConfigError, match="model.dtype='float8'"):
        build_model(ModelConfig(dtype="float8"))


def test_vocab_size_pads_the_embedding_and_tie_shares_the_head():
    cfg = ModelConfig(vocab_size=100, tie_word_embeddings=True, **SMALL)
    model = build_model(cfg)
    assert model.get_input_embeddings().weight.shape[0] == 100
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    untied = build_model(ModelConfig(**SMALL))
    assert untied.get_input_embeddings().weight.shape[0] == len(build_tokenizer(ModelConfig()))
    assert untied.lm_head.weight.data_ptr() != untied.get_input_embeddings().weight.data_ptr()


def test_a_vocab_smaller_than_the_tokenizer_is_refused():
    with pytest.raises(ConfigError, match="model.vocab_size=5 is smaller"):
        build_model(ModelConfig(vocab_size=5, **SMALL))
