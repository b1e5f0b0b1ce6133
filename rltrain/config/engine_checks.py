"""Cross-field checks of the engines (``actor.backend``, ``rollout.backend``, ``reward.kind``,
``weight_sync``): options a run could not honour are refused here, before Ray starts.

Registered with :func:`rltrain.config.validate.check`; imported by that module, so every
``load_config`` runs them. No torch, no Ray: whether this machine has GPUs and vLLM is read
from the driver's files and installed packages only.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

from rltrain.config.files import REWARD_HEADS, checkpoint_config, checkpoint_problems
from rltrain.config.schema import RunConfig
from rltrain.config.validate import check

#: The training engines that do not shard a model by tensor or pipeline parallelism.
_WHOLE_MODEL_ENGINES = {
    "torch": "the torch engine holds the whole model on every device (data parallel, DDP)",
    "deepspeed": "the DeepSpeed engine shards with ZeRO only",
}


#: Where the NVIDIA driver lists the GPUs it found, one directory each.
DRIVER_GPU_DIR = "/proc/driver/nvidia/gpus"


def driver_gpu_count() -> int:
    """GPUs the NVIDIA driver lists on this machine (0 without the driver); no torch, no NVML."""
    try:
        return len(os.listdir(DRIVER_GPU_DIR))
    except OSError:
        return 0


def local_gpus_visible() -> bool:
    """Whether this machine shows a CUDA GPU to the driver (without importing torch).

    Reads the NVIDIA driver's device list; an empty ``CUDA_VISIBLE_DEVICES`` hides them all.
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    return driver_gpu_count() > 0


def vllm_installed() -> bool:
    """Whether the ``vllm`` package can be imported by this interpreter (not imported here)."""
    return importlib.util.find_spec("vllm") is not None


@check
def _parallel_sizes(cfg: RunConfig) -> Iterator[str]:
    """Tensor/pipeline parallel sizes only the vLLM engine can honour."""
    a = cfg.actor
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(a, name)
        if value > 1:
            why = _WHOLE_MODEL_ENGINES.get(a.backend, "it does not shard the model")
            yield (
                f"actor.{name}={value} with actor.backend={a.backend!r}: {why}, so nothing would "
                f"be split; set actor.{name}=1 (shard the optimizer and weights with "
                f"actor.backend=deepspeed actor.zero_stage=3 instead)"
            )
    r = cfg.rollout
    if r.backend == "torch":
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(r, name)
            if value > 1:
                yield (
                    f"rollout.{name}={value} with rollout.backend='torch': the torch engine "
                    f"generates with the whole model on one device; use rollout.backend=vllm "
                    f"(tensor parallel on GPUs) or set rollout.{name}=1"
                )
    elif r.pipeline_parallel_size > 1:
        yield (
            f"rollout.pipeline_parallel_size={r.pipeline_parallel_size} with "
            f"rollout.backend='vllm': rltrain's vLLM engine is tensor-parallel only (one engine "
            f"per rollout process spanning its devices); use rollout.tensor_parallel_size"
        )
    inf = cfg.inference
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(inf, name)
        if value > 1:
            yield (
                f"inference.{name}={value}: the inference component recomputes log-probs with "
                f"the whole model on one device (a torch forward); set inference.{name}=1"
            )


#: vLLM 0.26's ``SamplingParams`` raises a temperature in ``(0, 0.01)`` to 0.01
#: (``vllm.sampling_params._MAX_TEMP``; tests/vllm_contract checks the value).
VLLM_MIN_TEMPERATURE = 0.01


@check
def _rollout_engine(cfg: RunConfig) -> Iterator[str]:
    """``rollout.backend=vllm`` needs CUDA GPUs and the vllm package; vLLM-only keys need it."""
    r = cfg.rollout
    if r.backend == "vllm":
        if cfg.runner != "reasoning":
            yield (
                f"rollout.backend='vllm' with runner={cfg.runner!r}: the embodied rollout runs "
                f"its own policy network; use rollout.backend=torch"
            )
        local = cfg.cluster.address is None
        if local and cfg.cluster.simulate_devices and not local_gpus_visible():
            yield (
                "rollout.backend='vllm' needs CUDA GPUs, but this machine has none, so "
                "cluster=local would run on simulated devices (cluster.simulate_devices=true); "
                "use rollout.backend=torch here, or run on GPU nodes"
            )
        elif local and not vllm_installed():
            yield (
                "rollout.backend='vllm' needs the vllm package, which this Python cannot import: "
                "pip install 'rltrain[vllm]' (a build matching the node's torch), or use "
                "rollout.backend=torch"
            )
    elif r.max_model_len is not None:
        yield (
            f"rollout.max_model_len={r.max_model_len} sizes a vLLM engine, but rollout.backend="
            f"'torch' generates up to task.max_prompt_length + rollout.max_new_tokens; drop it "
            f"or use rollout.backend=vllm"
        )
    if r.backend == "vllm" and 0 < r.temperature < VLLM_MIN_TEMPERATURE:
        yield (
            f"rollout.temperature={r.temperature}: vLLM 0.26 samples with at least "
            f"{VLLM_MIN_TEMPERATURE} (it raises anything lower), so the run would not sample what "
            f"it says; use rollout.temperature >= {VLLM_MIN_TEMPERATURE}, or rollout.backend=torch"
        )
    if r.backend == "vllm" and r.max_model_len is not None:
        need = cfg.task.max_prompt_length + r.max_new_tokens
        if r.max_model_len < need:
            yield (
                f"rollout.max_model_len={r.max_model_len} is shorter than task.max_prompt_length "
                f"+ rollout.max_new_tokens = {need}: raise it, or leave it null (that sum)"
            )


@check
def _training_engine(cfg: RunConfig) -> Iterator[str]:
    """Actor options the chosen training engine would ignore."""
    a = cfg.actor
    if a.backend == "torch" and a.zero_stage != 0:
        yield (
            f"actor.zero_stage={a.zero_stage} with actor.backend='torch': ZeRO is DeepSpeed's; "
            f"use actor.backend=deepspeed, or leave actor.zero_stage=0"
        )
    if cfg.runner == "embodied":
        if a.backend != "torch":
            yield (
                f"actor.backend={a.backend!r} with runner='embodied': the embodied actor trains "
                f"its policy network with torch; use actor.backend=torch"
            )
        if a.gradient_checkpointing:
            yield (
                "actor.gradient_checkpointing=true with runner='embodied': the embodied policy "
                "is a small network without checkpointed layers; set it to false"
            )


@check
def _reward_engine(cfg: RunConfig) -> Iterator[str]:
    """A reward model needs a sequence-classification checkpoint; a rule reward takes none."""
    rw = cfg.reward
    if rw.kind == "rule" and rw.model_path:
        yield (
            f"reward.model_path={rw.model_path!r} is set but reward.kind='rule' scores with the "
            f"task's rule and would ignore it: set reward.kind=model, or drop reward.model_path"
        )
    if rw.kind == "model":
        if cfg.runner != "reasoning":
            yield (
                f"reward.kind='model' with runner={cfg.runner!r}: embodied runs take their "
                f"rewards from the environment; use reward.kind=rule"
            )
        path = rw.model_path
        if path and not os.path.isfile(os.path.join(path, "config.json")):
            yield (
                f"reward.model_path={path!r} is not a Hugging Face checkpoint directory (no "
                f"config.json): save the reward model with model.save_pretrained(dir) and its "
                f"tokenizer with tokenizer.save_pretrained(dir)"
            )
        elif path:
            yield from checkpoint_problems("reward.model_path", path, REWARD_HEADS)


@check
def _inference_component(cfg: RunConfig) -> Iterator[str]:
    """The inference component recomputes log-probs of a synchronous step."""
    placed = {n.strip() for k in cfg.placement.component_placement for n in str(k).split(",")}
    if "inference" not in placed:
        return
    if cfg.runner != "reasoning":
        yield (
            f"placement.component_placement places an inference component, but runner="
            f"{cfg.runner!r} does not use one: remove it from the placement"
        )
    if cfg.trainer.max_staleness > 0:
        yield (
            f"trainer.max_staleness={cfg.trainer.max_staleness} with an inference component: "
            f"it recomputes log-probs under the actor's current weights, while an asynchronous "
            f"step must take its ratio against the (older) policy that sampled; remove the "
            f"inference component or set trainer.max_staleness=0"
        )


#: Linear layers of a Llama/Qwen2 decoder layer that ``actor.lora.target_modules`` may name
#: (the plan sizes each adapter from them: rltrain.placement.memory.lora_linear_shapes).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _layer_shapes(cfg: RunConfig) -> dict[str, tuple[int, int]] | None:
    """``(in, out)`` of each Linear layer ``actor.lora.target_modules`` may name, from the
    model fields or ``model.path``'s config.json (None when the sizes are unknown)."""
    m = cfg.model
    if m.path is not None and not cfg.task.generate:
        config = checkpoint_config(m.path) or {}
        try:
            hidden = int(config["hidden_size"])
            inter = int(config["intermediate_size"])
            heads = int(config["num_attention_heads"])
            kv = int(config.get("num_key_value_heads") or heads)
        except (KeyError, TypeError, ValueError):
            return None
    else:
        hidden, inter, heads, kv = m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads
    if min(hidden, inter, heads, kv) <= 0:
        return None
    kv_dim = kv * (hidden // heads)
    return {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv_dim),
        "v_proj": (hidden, kv_dim),
        "o_proj": (hidden, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def _lora_rank(cfg: RunConfig, targets: list[str]) -> Iterator[str]:
    """A rank above a targeted layer's ``min(in, out)`` adds parameters and no capacity."""
    shapes = _layer_shapes(cfg)
    if not shapes or not targets:
        return
    name = min(targets, key=lambda t: min(shapes[t]))
    limit = min(shapes[name])
    rank = cfg.actor.lora.rank
    if rank > limit:
        yield (
            f"actor.lora.rank={rank} is above what the smallest targeted layer can use "
            f"({name}: {shapes[name][0]} x {shapes[name][1]}, rank at most {limit}): a LoRA "
            f"update's rank is at most min(in, out); set actor.lora.rank <= {limit} (8-64 is "
            f"usual)"
        )


@check
def _lora(cfg: RunConfig) -> Iterator[str]:
    """LoRA adapters (``actor.lora.*``): values, and the engines that can train them."""
    lora, a = cfg.actor.lora, cfg.actor
    if lora.rank < 0:
        yield f"actor.lora.rank={lora.rank} must be >= 0 (0: train the full model)"
    # The values are checked with LoRA off too: a bad one is wrong before it is switched on.
    if not lora.alpha > 0:
        yield f"actor.lora.alpha={lora.alpha!r} must be > 0 (the adapters' scale is alpha/rank)"
    if not 0 <= lora.dropout < 1:
        yield f"actor.lora.dropout={lora.dropout!r} must be in [0, 1)"
    targets = list(lora.target_modules)
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if not targets or unknown:
        yield (
            f"actor.lora.target_modules={targets} must name Linear layers of a Llama/Qwen2 "
            f"decoder layer, some of {list(LORA_TARGETS)}"
            + (f" ({unknown} is not one)" if unknown else "")
        )
    if lora.rank <= 0:
        return
    yield from _lora_rank(cfg, [t for t in targets if t in LORA_TARGETS])
    if cfg.runner != "reasoning":
        yield (
            f"actor.lora.rank={lora.rank} with runner={cfg.runner!r}: LoRA adapts the reasoning "
            f"runner's language-model policy; set actor.lora.rank=0"
        )
    if a.backend == "deepspeed" and a.zero_stage == 3:
        yield (
            f"actor.lora.rank={lora.rank} with actor.backend=deepspeed actor.zero_stage=3: ZeRO-3 "
            f"partitions every layer's weights across ranks, and the merged weight export and "
            f"the adapters-disabled reference need whole layers; use actor.zero_stage 0-2 (the "
            f"adapters' optimizer state is small), or actor.lora.rank=0"
        )
