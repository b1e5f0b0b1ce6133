"""The memory model: bytes a component's process holds on its devices, term by term.

One function per term, each with its formula. The plan predicts every term with them; the
run-time ledger (the residency coordinator) registers each worker's measured state instead and
takes only a stage's transient terms from the plan (:func:`transient_kinds`, applied for the
run's engines), so the two agree where the formulas match the workers' state. Sizes are per
*process*; a process spread over
``k`` devices (a rollout engine with tensor parallelism) holds ``1/k`` of each term on each.

Terms (state kinds): ``weights``, ``grads``, ``optimizer``, ``kv_cache`` (these may be offloaded
by policy), ``activations`` (only while the component runs), ``weight_sync`` (the actor's CUDA-IPC
export buckets, in the ``sync`` stage only) and ``context`` (the per-process device context:
CUDA's, about 0.5 GiB; none on simulated devices). The torch generation engine's ``kv_cache`` is
transient too (:func:`transient_kinds`): it exists only while the rollout generates.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from rltrain.config.schema import SPECIAL_TOKENS
from rltrain.errors import ConfigError

MIB = 1024**2

#: Bytes per element of each model dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

#: Device context per process per CUDA device (driver, cuBLAS/NCCL workspaces).
CUDA_CONTEXT_BYTES = 512 * MIB

#: Activation elements kept per token, per layer, per unit of hidden size for backward, in the
#: model dtype: Korthikanti et al. (2022) count 34 bytes·s·b·h per layer in 16-bit, i.e. 17
#: elements, leaving out the attention-score term that fused attention does not store.
ACTIVATION_ELEMENTS = 17

#: Adam keeps two fp32 moments per parameter.
ADAM_MOMENT_BYTES = 8

#: Under bf16/fp16 training the optimizer also keeps an fp32 master copy of the weights.
MASTER_WEIGHT_BYTES = 4

#: Vocabulary the plan counts for the built-in tokenizer over its default alphabet
#: (``model.vocab_chars`` null). The tokenizer has 22 tokens there; 32 over-counts the embedding
#: and LM head by 10 rows (a few KiB for the shipped tiny models), and the hand-computed sizes
#: across the tests are written with it.
DEFAULT_VOCAB_SIZE = 32

STATE_KINDS = ("weights", "grads", "optimizer", "kv_cache")
KINDS = (*STATE_KINDS, "activations", "context")


@dataclass(frozen=True)
class ModelDims:
    """The sizes the memory model needs from a decoder-only transformer."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str = "float32"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


def dtype_bytes(dtype: str, key: str = "model.dtype") -> int:
    """Bytes per element of ``dtype``.

    Raises:
        ConfigError: for a dtype other than float32, bfloat16, float16.
    """
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"{key}={dtype!r} is not one of {list(DTYPE_BYTES)}") from None


def model_dims(model: Any) -> ModelDims:
    """Model sizes from the ``model`` config, or from ``model.path``'s ``config.json``.

    Args:
        model: the model section (dataclass, dict or DictConfig).

    Returns:
        The sizes. A checkpoint's ``torch_dtype`` is ignored: ``model.dtype`` is what runs.

    Raises:
        ConfigError: when ``model.path`` has no readable ``config.json`` with the sizes.
    """
    get = model.get if hasattr(model, "get") else lambda k, d=None: getattr(model, k, d)
    dtype = str(get("dtype", "float32"))
    path = get("path", None)
    if path is None:
        return ModelDims(
            hidden_size=int(get("hidden_size")),
            intermediate_size=int(get("intermediate_size")),
            num_layers=int(get("num_layers")),
            num_heads=int(get("num_heads")),
            num_kv_heads=int(get("num_kv_heads")),
            vocab_size=int(get("vocab_size", None) or built_in_vocab_size(get("vocab_chars"))),
            max_position_embeddings=int(get("max_position_embeddings")),
            dtype=dtype,
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=get("family", "llama") == "qwen2",
        )
    return checkpoint_dims(str(path), dtype)


def built_in_vocab_size(chars: str | None) -> int:
    """Tokens of the built-in character tokenizer over ``model.vocab_chars``, as
    :func:`rltrain.tasks.tokenizer.build_char_tokenizer` builds it: the special tokens, then one
    per character (null: :data:`DEFAULT_VOCAB_SIZE`). The model built from fields has this many
    embedding rows when ``model.vocab_size`` is null.

    Args:
        chars: ``model.vocab_chars``.

    Returns:
        The vocabulary size.
    """
    if chars is None:
        return DEFAULT_VOCAB_SIZE
    return len(SPECIAL_TOKENS) + len(str(chars))


def saved_dtype(path: str) -> str | None:
    """The dtype a Hugging Face checkpoint was saved in (``config.json``'s ``dtype``, or
    ``torch_dtype`` in older files), when it is one the plan counts; else None.

    Args:
        path: the checkpoint directory.

    Returns:
        ``float32``, ``bfloat16`` or ``float16``, or None (no such field, or no readable file).
    """
    try:
        with open(os.path.join(path, "config.json")) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return None
    value = c.get("dtype") or c.get("torch_dtype") if isinstance(c, dict) else None
    return value if value in DTYPE_BYTES else None


def checkpoint_dims(path: str, dtype: str) -> ModelDims:
    """Model sizes from a Hugging Face checkpoint's ``config.json``.

    Raises:
        ConfigError: when the file is missing or lacks a size.
    """
    file = os.path.join(path, "config.json")
    try:
        with open(file) as f:
            c = json.load(f)
        heads = int(c["num_attention_heads"])
        return ModelDims(
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            vocab_size=int(c["vocab_size"]),
            max_position_embeddings=int(c["max_position_embeddings"]),
            dtype=dtype,
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"model.path={path!r}: cannot read the model sizes from {file} ({exc!r}): point "
            f"model.path at a Hugging Face checkpoint directory"
        ) from None


def param_count(d: ModelDims) -> int:
    """Parameters of a Llama/Qwen2-style decoder.

    ``V·h`` (embeddings) + ``L·(h·(h + 2·kv) + h·h + 3·h·i + 2·h)`` (q, k, v, o, gate/up/down,
    two norms) + ``h`` (final norm) + ``V·h`` (LM head, unless tied) + ``L·(h + 2·kv)`` (q/k/v
    biases, Qwen2).
    """
    h, i, kv, layers, v = d.hidden_size, d.intermediate_size, d.kv_dim, d.num_layers, d.vocab_size
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * i + 2 * h
    if d.qkv_bias:
        per_layer += h + 2 * kv
    head = 0 if d.tie_word_embeddings else v * h
    return v * h + layers * per_layer + h + head


def value_param_count(d: ModelDims) -> int:
    """Parameters of the PPO critic's value model: the policy's transformer without its LM head
    (``V·h``, unless tied to the embeddings) plus a scalar head (``h + 1``)."""
    head = 0 if d.tie_word_embeddings else d.vocab_size * d.hidden_size
    return param_count(d) - head + d.hidden_size + 1


def reward_param_count(d: ModelDims) -> int:
    """Parameters of a sequence-classification reward model (what
    ``AutoModelForSequenceClassification`` loads): the decoder without its LM head (``V·h``,
    unless tied to the embeddings) plus a one-score head without bias (``h``): the critic's
    value model but its head's bias."""
    return value_param_count(d) - 1


@dataclass(frozen=True)
class PolicyDims:
    """The sizes of the embodied runner's actor-critic (two tanh MLPs over flat observations,
    as :func:`rltrain.workers.embodied.build_policy` builds it; always float32).

    Attributes:
        obs_dim: length of the flat observation.
        action_dim: actions (discrete) or action dimensions (continuous).
        continuous: whether actions are a Box (then a learned ``log_std`` per dimension).
        hidden: ``model.hidden_size``.
        layers: ``model.num_layers`` (hidden layers per MLP).
    """

    obs_dim: int
    action_dim: int
    continuous: bool
    hidden: int
    layers: int


#: The embodied policy is built in float32 whatever ``model.dtype`` says.
POLICY_DTYPE = "float32"


def mlp_param_count(inputs: int, hidden: int, layers: int, outputs: int) -> int:
    """Parameters of ``layers`` Linear+tanh layers of width ``hidden`` and a Linear head:
    ``(i·h + h) + (L-1)·(h·h + h) + (h·o + o)``; with no hidden layer, ``i·o + o``."""
    if layers < 1:
        return inputs * outputs + outputs
    return (
        inputs * hidden
        + hidden
        + (layers - 1) * (hidden * hidden + hidden)
        + (hidden * outputs + outputs)
    )


def policy_param_count(d: PolicyDims) -> int:
    """Parameters of the actor-critic: the policy MLP (``action_dim`` outputs), the value MLP
    (one output) and, for continuous actions, ``log_std`` (``action_dim``)."""
    policy = mlp_param_count(d.obs_dim, d.hidden, d.layers, d.action_dim)
    value = mlp_param_count(d.obs_dim, d.hidden, d.layers, 1)
    return policy + value + (d.action_dim if d.continuous else 0)


def policy_train_activation_bytes(transitions: int, rows: int, d: PolicyDims) -> int:
    """Bytes the embodied actor holds while it trains, in float32.

    Every rank keeps the whole epoch on its device (``transitions`` rows of observations,
    final observations for truncation bootstraps, actions, and seven scalars: rewards, dones,
    truncations, log-probs, values, advantages, returns), and a minibatch of ``rows`` keeps,
    for backward, each hidden layer's Linear and tanh outputs in both MLPs plus the two heads'
    outputs: ``4·(T·(2·obs + a + 7) + rows·(4·L·h + A + 1))`` with ``a`` = ``action_dim`` for
    continuous actions, 1 for discrete.
    """
    action_cols = d.action_dim if d.continuous else 1
    batch = transitions * (2 * d.obs_dim + action_cols + 7)
    saved = rows * (4 * d.layers * d.hidden + d.action_dim + 1)
    return DTYPE_BYTES[POLICY_DTYPE] * (batch + saved)


def policy_infer_activation_bytes(rows: int, d: PolicyDims) -> int:
    """Bytes the embodied rollout holds while it infers ``rows`` observations, in float32: the
    observations, two hidden activations alive at once (no autograd), the action outputs:
    ``4·rows·(obs + 2·h + A)``."""
    return DTYPE_BYTES[POLICY_DTYPE] * rows * (d.obs_dim + 2 * d.hidden + d.action_dim)


def lora_linear_shapes(d: ModelDims) -> dict[str, tuple[int, int]]:
    """``(in, out)`` features of each Linear of a Llama/Qwen2 decoder layer that LoRA may target
    (``actor.lora.target_modules``)."""
    h, i, kv = d.hidden_size, d.intermediate_size, d.kv_dim
    return {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def lora_param_count(d: ModelDims, rank: int, targets: Any) -> int:
    """LoRA adapter parameters: ``L · Σ_targets rank · (in + out)`` (``A`` is ``rank x in``,
    ``B`` is ``out x rank``, one pair per targeted Linear of each layer).

    Raises:
        ConfigError: a target that is not a Linear of a Llama/Qwen2 decoder layer.
    """
    shapes = lora_linear_shapes(d)
    names = list(dict.fromkeys(str(t) for t in targets))
    unknown = [t for t in names if t not in shapes]
    if unknown:
        raise ConfigError(
            f"actor.lora.target_modules has {unknown}: name Linear layers of a Llama/Qwen2 "
            f"decoder layer, {list(shapes)}"
        )
    return d.num_layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in names)


def actor_param_counts(run: Any, d: ModelDims, params: int) -> tuple[int, int]:
    """``(held, trained)`` parameters of an actor process: ``(params, params)`` for full
    training; under LoRA (``actor.lora.rank > 0``) the base plus the adapters are held and only
    the adapters (:func:`lora_param_count`) have gradients and optimizer state."""
    lora = _get(_get(run, "actor"), "lora")
    rank = int(_get(lora, "rank", 0) or 0)
    if rank <= 0:
        return params, params
    adapters = lora_param_count(d, rank, _get(lora, "target_modules", ()))
    return params + adapters, adapters


def _div(num: int, den: int) -> int:
    return -(-num // den)


def weight_bytes(params: int, dtype: str, shards: int = 1) -> int:
    """Weights: ``ceil(params · bytes(dtype) / shards)``; shards = tp·pp (·dp under ZeRO-3)."""
    return _div(params * dtype_bytes(dtype), shards)


def grad_bytes(params: int, dtype: str, shards: int = 1) -> int:
    """Gradients, at the model dtype: ``ceil(params · bytes(dtype) / shards)``;
    shards = tp·pp (·dp under ZeRO-2/3)."""
    return _div(params * dtype_bytes(dtype), shards)


def optimizer_bytes(params: int, dtype: str, shards: int = 1) -> int:
    """Adam state: ``ceil(params · (8 + (4 if dtype is 16-bit else 0)) / shards)``.

    Two fp32 moments, plus an fp32 master copy of the weights under bf16/fp16;
    shards = tp·pp (·dp under ZeRO-1/2/3).
    """
    per = ADAM_MOMENT_BYTES + (MASTER_WEIGHT_BYTES if dtype_bytes(dtype) < 4 else 0)
    return _div(params * per, shards)


def zero_divisors(zero_stage: int, dp: int) -> dict[str, int]:
    """The data-parallel divisor ZeRO applies to each state kind.

    Stage 1 shards the optimizer, stage 2 also the gradients, stage 3 also the weights:
    ``{"weights": dp if stage >= 3, "grads": dp if stage >= 2, "optimizer": dp if stage >= 1}``
    (1 otherwise).
    """
    return {
        "weights": dp if zero_stage >= 3 else 1,
        "grads": dp if zero_stage >= 2 else 1,
        "optimizer": dp if zero_stage >= 1 else 1,
    }


#: Float32 vocabulary-wide rows one response token holds at a micro-batch's peak, by pass.
#: Measured with torch's memory profiler on CPU (fp32 and bf16 models alike; held by
#: tests/unit/placement/test_logits_memory.py): a training step keeps the float logits, the
#: log-softmax autograd saves and backward's gradients (5); an entropy in the loss adds its
#: own autograd state (6); a forward pass without autograd holds the logits and their
#: log-softmax (2).
LOGIT_COPIES = {"train": 5, "train_entropy": 6, "forward": 2}


def activation_bytes(
    micro_batch: int,
    seq_len: int,
    d: ModelDims,
    shards: int = 1,
    training: bool = True,
    checkpointing: bool = False,
    outputs_per_token: int | None = None,
    max_tokens: int | None = None,
    response_len: int | None = None,
    logit_copies: int = 1,
) -> int:
    """Activations of one micro-batch, plus its fp32 logits.

    Training keeps ``b·s·h·L·17`` elements (model dtype) for backward; with gradient
    checkpointing only each layer's input (``b·s·h·L``) plus one layer recomputed
    (``b·s·h·17``); a forward pass alone holds one layer's (``b·s·h·17``). Logits add
    ``b·r·V·4·c`` bytes: ``r`` the tokens whose log-probs are taken (``response_len``; the
    whole sequence when None), ``c`` the fp32 copies alive at the peak (:data:`LOGIT_COPIES`);
    the critic's values are ``b·s·1·4`` (``outputs_per_token=1``). The total is divided by
    ``shards`` (the tensor-parallel size). Under a token budget
    (``actor.max_tokens_per_micro_batch``: micro-batches of at most ``max_tokens`` padded
    tokens, whatever their rows) the micro-batch's tokens ``b·s`` are ``min(b·s, max_tokens)``,
    its response tokens the same share of them.
    """
    tokens = micro_batch * seq_len
    share = 1.0 if response_len is None else min(response_len, seq_len) / seq_len
    if max_tokens is not None:
        tokens = min(tokens, max_tokens)
    logit_tokens = math.ceil(tokens * share)
    base = tokens * d.hidden_size
    if not training:
        elements = base * ACTIVATION_ELEMENTS
    elif checkpointing:
        elements = base * d.num_layers + base * ACTIVATION_ELEMENTS
    else:
        elements = base * d.num_layers * ACTIVATION_ELEMENTS
    if outputs_per_token is None:
        logits = logit_tokens * d.vocab_size * 4 * logit_copies
    else:
        logits = tokens * outputs_per_token * 4
    return _div(elements * dtype_bytes(d.dtype) + logits, shards)


def kv_cache_bytes(batch: int, seq_len: int, d: ModelDims) -> int:
    """KV cache of the torch (HF generate) backend: ``2·b·s·L·kv_dim·bytes(dtype)``."""
    return batch * seq_len * kv_bytes_per_token(d)


def vllm_reserved_bytes(utilization: float, capacity_bytes: int, num_devices: int = 1) -> int:
    """What a vLLM engine reserves: ``floor(utilization · capacity)`` on each of its devices.

    The reservation holds weights, KV cache and activations; the plan splits it into the weights
    and a ``kv_cache`` term for the rest.
    """
    return math.floor(utilization * capacity_bytes) * num_devices


def context_bytes(accelerator_type: str) -> int:
    """Per-process device context: ``CUDA_CONTEXT_BYTES`` on ``cuda`` devices, 0 on simulated."""
    return CUDA_CONTEXT_BYTES if accelerator_type == "cuda" else 0


def rollout_batch_per_process(train_batch_size: int, n_samples: int, world_size: int) -> int:
    """Sequences one rollout process generates at once: ``ceil(prompts · samples / world)``."""
    return _div(train_batch_size * n_samples, max(world_size, 1))


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if hasattr(obj, "get") and not hasattr(obj, "__dataclass_fields__"):
        return obj.get(key, default)
    return getattr(obj, key, default)


def response_budget(run: Any) -> tuple[int, str]:
    """The tokens a response may take after its prompt, and the keys that set it.

    Single-turn: ``rollout.max_new_tokens``. Multi-turn (``task.env``): ``rollout.max_total_tokens``
    (every turn and tool result), or where it is null ``rollout.max_turns x
    rollout.max_new_tokens`` (tool results uncounted here: the rollout ends an episode, as
    truncated, where its prompt, turns and tool results reach the model's
    ``max_position_embeddings``).

    Args:
        run: a :class:`rltrain.config.schema.RunConfig` (or a section-alike).

    Returns:
        ``(tokens, keys)``: the budget and the config keys to name in a message.
    """
    r, task = _get(run, "rollout"), _get(run, "task")
    new = int(_get(r, "max_new_tokens", 0) or 0)
    if not _get(task, "env", None):
        return new, f"rollout.max_new_tokens={new}"
    total = _get(r, "max_total_tokens", None)
    if total is not None:
        return int(total), f"rollout.max_total_tokens={total}"
    turns = int(_get(r, "max_turns", 1) or 1)
    return (
        turns * new,
        f"rollout.max_turns x rollout.max_new_tokens = {turns} x {new} "
        f"(rollout.max_total_tokens=null)",
    )


def sequence_length(run: Any, d: ModelDims) -> int:
    """Tokens per sequence the run feeds the model: a prompt plus its response.

    ``task.max_prompt_length`` plus the response budget (:func:`response_budget`:
    ``rollout.max_new_tokens``, or a multi-turn episode's total), capped by the model's
    ``max_position_embeddings`` (a checkpoint's context, 32,768 for Qwen2.5, is what the model
    could take, not what the run sends it).

    Args:
        run: the run config (``task`` and ``rollout`` sections; absent keys count as 0).
        d: the model's sizes.

    Returns:
        The sequence length, at least 1.
    """
    prompt = int(_get(_get(run, "task"), "max_prompt_length", 0) or 0)
    new = response_budget(run)[0]
    if prompt + new <= 0:
        return d.max_position_embeddings
    return max(1, min(prompt + new, d.max_position_embeddings))


def vllm_max_model_len(run: Any, d: ModelDims) -> int:
    """Tokens per sequence a vLLM engine must hold: ``rollout.max_model_len`` when set, else
    :func:`sequence_length`; capped by ``max_position_embeddings`` either way."""
    set_len = _get(_get(run, "rollout"), "max_model_len", None)
    if set_len:
        return max(1, min(int(set_len), d.max_position_embeddings))
    return sequence_length(run, d)


def kv_bytes_per_token(d: ModelDims, shards: int = 1) -> int:
    """KV cache per token of one sequence: ``2·L·kv_dim·bytes(dtype) / shards`` (TP)."""
    return _div(2 * d.num_layers * d.kv_dim * dtype_bytes(d.dtype), shards)


#: The actor's CUDA-IPC export buckets: held from an export until every receiver on its GPU
#: has loaded them (rltrain.backends.weight_sync.ipc), planned in the ``sync`` stage only.
EXPORT_KIND = "weight_sync"

#: Kinds a process holds only while a stage that uses them runs (not state it keeps).
TRANSIENT_KINDS = ("activations", EXPORT_KIND)


def transient_kinds(kv_reserved: bool) -> tuple[str, ...]:
    """The kinds a process holds only while a stage that uses them runs.

    :data:`TRANSIENT_KINDS`, plus the generation engine's ``kv_cache`` unless the engine reserves
    it (``kv_reserved``, vLLM): the torch engine allocates its cache for a ``generate`` call and
    frees it after, while a reserved cache stays on the device until the engine sleeps, so it is
    state that an offload policy moves and that the worker's ledger measures.

    Args:
        kv_reserved: the generation engine's entry says ``kv_reserved``.

    Returns:
        The transient kinds.
    """
    return TRANSIENT_KINDS if kv_reserved else (*TRANSIENT_KINDS, "kv_cache")


def ipc_export_bytes(params: int, dtype: str, shards: int = 1) -> int:
    """The actor's IPC export buckets (``weight_sync``): one packed copy of the weights it
    exports, ``ceil(params · bytes(dtype) / shards)`` (shards = tp·pp); freed once every
    receiver has loaded them."""
    return weight_bytes(params, dtype, shards)
