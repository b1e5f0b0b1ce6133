"""Hugging Face ``config.json`` contents the tests write beside (weightless) checkpoints."""

from __future__ import annotations

#: Qwen2.5-0.5B(-Instruct)'s config.json: the sizes the plan and the model-field checks read.
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
