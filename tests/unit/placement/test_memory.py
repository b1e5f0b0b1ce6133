"""The memory model's terms, against hand-computed numbers."""

from __future__ import annotations

import json

import pytest

from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.errors import ConfigError
from rltrain.placement import memory as mem
from rltrain.placement.types import GIB

# h=1024, i=4096, L=8, 8 heads, 8 kv heads (kv_dim 1024), vocab 32 (built-in), bf16, 128 positions
MID = ModelConfig(
    hidden_size=1024,
    intermediate_size=4096,
    num_layers=8,
    num_heads=8,
    num_kv_heads=8,
    max_position_embeddings=128,
    dtype="bfloat16",
)
# per layer: 1024*(1024+2048) + 1024*1024 + 3*1024*4096 + 2*1024 = 16_779_264
# all: 32*1024 (embed) + 8*16_779_264 + 1024 (norm) + 32*1024 (head) = 134_300_672
MID_PARAMS = 134_300_672


def test_param_counts():
    assert mem.param_count(mem.model_dims(MID)) == MID_PARAMS
    # the shipped tiny llama: 2*32*64 + 2*(64*192 + 64*64 + 3*64*128 + 128) + 64 = 86_336
    assert mem.param_count(mem.model_dims(ModelConfig())) == 86_336


def test_checkpoint_sizes_come_from_config_json(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 100,
                "max_position_embeddings": 256,
                "tie_word_embeddings": True,
            }
        )
    )
    d = mem.model_dims(ModelConfig(path=str(tmp_path), dtype="float16"))
    assert (d.kv_dim, d.vocab_size, d.max_position_embeddings, d.dtype) == (32, 100, 256, "float16")
    # per layer: 64*(64+64) + 64*64 + 3*64*128 + 2*64 + bias (64+64) = 37_120
    # all: 100*64 + 2*37_120 + 64 (tied head) = 80_704
    assert mem.param_count(d) == 80_704
    with pytest.raises(ConfigError, match="cannot read the model sizes"):
        mem.model_dims(ModelConfig(path=str(tmp_path / "missing")))


def test_state_terms_and_zero_divisors():
    p = MID_PARAMS
    assert mem.weight_bytes(p, "bfloat16") == 268_601_344
    assert mem.grad_bytes(p, "float32", shards=2) == 268_601_344
    # Adam under bf16: 8 (two fp32 moments) + 4 (fp32 master) bytes per parameter
    assert mem.optimizer_bytes(p, "bfloat16") == 1_611_608_064
    assert mem.optimizer_bytes(p, "float32") == 1_074_405_376  # moments only
    assert mem.zero_divisors(0, 4) == {"weights": 1, "grads": 1, "optimizer": 1}
    assert mem.zero_divisors(1, 4) == {"weights": 1, "grads": 1, "optimizer": 4}
    assert mem.zero_divisors(2, 4) == {"weights": 1, "grads": 4, "optimizer": 4}
    assert mem.zero_divisors(3, 4) == {"weights": 4, "grads": 4, "optimizer": 4}


def test_activation_and_kv_terms():
    d = mem.model_dims(MID)
    # b*s*h = 64*128*1024 = 8_388_608; logits 64*128*32*4 = 1_048_576 bytes
    assert mem.activation_bytes(64, 128, d) == 8_388_608 * 8 * 17 * 2 + 1_048_576
    assert (
        mem.activation_bytes(64, 128, d, checkpointing=True)
        == (8_388_608 * 8 + 8_388_608 * 17) * 2 + 1_048_576
    )
    assert mem.activation_bytes(64, 128, d, training=False) == 8_388_608 * 17 * 2 + 1_048_576
    assert mem.activation_bytes(64, 128, d, shards=2) == (8_388_608 * 8 * 17 * 2 + 1_048_576) // 2
    # 2 (k and v) * 64 seqs * 128 tokens * 8 layers * 1024 * 2 bytes
    assert mem.kv_cache_bytes(64, 128, d) == 268_435_456
    assert mem.rollout_batch_per_process(8, 16, 3) == 43  # ceil(128 / 3)
    assert mem.vllm_reserved_bytes(0.8, 16 * GIB) == 13_743_895_347  # floor(0.8 * 16 GiB)


def test_context_only_on_cuda():
    assert mem.context_bytes("cuda") == 512 * mem.MIB
    assert mem.context_bytes("sim") == 0
    assert mem.context_bytes("none") == 0


def test_unknown_dtype_names_the_key():
    with pytest.raises(ConfigError, match="model.dtype='int8'"):
        mem.dtype_bytes("int8")


def test_sequence_length_is_prompt_plus_response_capped_by_the_model():
    d = mem.model_dims(MID)  # 128 positions
    run = RunConfig()
    run.task.max_prompt_length, run.rollout.max_new_tokens = 20, 12
    assert mem.sequence_length(run, d) == 32
    run.task.max_prompt_length = 500
    assert mem.sequence_length(run, d) == 128  # the model takes no more
    run.rollout.max_model_len = 64
    assert mem.vllm_max_model_len(run, d) == 64
    run.rollout.max_model_len = 4096
    assert mem.vllm_max_model_len(run, d) == 128
    # 2 (k, v) * 8 layers * 1024 (kv_dim) * 2 bytes
    assert mem.kv_bytes_per_token(d) == 32_768
    assert mem.kv_bytes_per_token(d, shards=2) == 16_384


# 71 characters: letters, digits and "+-*/=(). " (9)
ALPHABET71 = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-*/=(). "


def test_the_vocabulary_follows_vocab_chars():
    assert len(ALPHABET71) == 71
    d = mem.model_dims(ModelConfig(vocab_chars=ALPHABET71))
    # <pad> <eos> <unk> + 71 characters
    assert d.vocab_size == 74
    # 2*74*64 (embeddings, head) + 2*(64*192 + 64*64 + 3*64*128 + 128) + 64 = 91_712 params
    assert mem.weight_bytes(mem.param_count(d), "float32") == 366_848
    # an explicit vocab_size (padded rows) wins over the alphabet
    assert mem.model_dims(ModelConfig(vocab_chars=ALPHABET71, vocab_size=128)).vocab_size == 128


def test_the_vocabulary_is_the_built_models():
    pytest.importorskip("transformers")
    from rltrain.tasks.model import build_model

    cfg = ModelConfig(vocab_chars=ALPHABET71)
    model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == mem.param_count(mem.model_dims(cfg))
