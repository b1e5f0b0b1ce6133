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

#: A tiny Llama's config.json (the built-in model's sizes): tests that need a checkpoint's
#: fields, not its weights, write it with their own ``max_position_embeddings`` or head.
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 100,
    "max_position_embeddings": 64,
}
