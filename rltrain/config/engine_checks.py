"""Cross-field checks of the engines (``actor.backend``, ``rollout.backend``, ``reward.kind``,
``weight_sync``): options a run could not honour are refused here, before Ray starts. Each
engine's needs and its own checks come from its entry in :mod:`rltrain.kinds.registry`.

Registered with :func:`rltrain.config.checks.check`; imported by validate, so every
``load_config`` runs them. No torch, no Ray: whether this machine has GPUs and vLLM is read
from the driver's files and installed packages only.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator

from rltrain.config.checks import check
from rltrain.config.files import REWARD_HEADS, checkpoint_config, checkpoint_problems
from rltrain.config.schema import RunConfig
from rltrain.kinds import registry
from rltrain.kinds.records import EngineKind

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


def package_installed(name: str) -> bool:
    """Whether a package can be imported by this interpreter (not imported here)."""
    return importlib.util.find_spec(name) is not None


def _language_model(cfg: RunConfig) -> bool:
    """Whether the run's runner kind trains a language model (an unknown one: reported by
    validate._run, and not refused twice here)."""
    return cfg.runner not in registry.runner_names() or registry.runner(cfg).language_model


@check
def _inference_parallel_sizes(cfg: RunConfig) -> Iterator[str]:
    """The inference component recomputes log-probs with the whole model on one device."""
    inf = cfg.inference
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(inf, name)
        if value > 1:
            yield (
                f"inference.{name}={value}: the inference component recomputes log-probs with "
                f"the whole model on one device (a torch forward); set inference.{name}=1"
            )


@check
def _engines(cfg: RunConfig) -> Iterator[str]:
    """Each engine's needs (its runner kinds, CUDA, its package) and its own checks."""
    if cfg.runner not in registry.runner_names():
        return  # reported by validate._run
    for role, name in (("training", cfg.actor.backend), ("generation", cfg.rollout.backend)):
        if name not in registry.engine_names(role):
            continue  # reported by validate._components
        kind = registry.engine(role, name)
        yield from _engine_runner(cfg, kind)
        yield from _engine_needs(cfg, kind)
        for engine_check in kind.config_checks:
            yield from engine_check(cfg)
    yield from _max_model_len(cfg)


def _choices(role: str, keep: Callable[[EngineKind], bool]) -> str:
    """The engines of a role a fix may name (``a`` or ``a | b``)."""
    names = [n for n in registry.engine_names(role) if keep(registry.engine(role, n))]
    return " | ".join(names) or "?"


def _engine_runner(cfg: RunConfig, kind: EngineKind) -> Iterator[str]:
    """An engine only the runner kinds it lists can use."""
    if cfg.runner in kind.runners:
        return
    note = registry.runner(cfg).engine_notes.get(kind.role, "it does not use this engine")
    fix = _choices(kind.role, lambda e: cfg.runner in e.runners)
    yield f"{kind.key}={kind.name!r} with runner={cfg.runner!r}: {note}; use {kind.key}={fix}"


def _engine_needs(cfg: RunConfig, kind: EngineKind) -> Iterator[str]:
    """CUDA GPUs and packages the engine needs on a local cluster."""
    if cfg.cluster.address is not None:
        return  # the nodes of a cluster to join are checked when Ray starts
    key, name = kind.key, kind.name
    if kind.needs_cuda and cfg.cluster.simulate_devices and not local_gpus_visible():
        cpu = _choices(kind.role, lambda e: not e.needs_cuda)
        yield (
            f"{key}={name!r} needs CUDA GPUs, but this machine has none, so cluster=local would "
            f"run on simulated devices (cluster.simulate_devices=true); use {key}={cpu} here, "
            f"or run on GPU nodes"
        )
    elif kind.package and not package_installed(kind.package):
        other = _choices(kind.role, lambda e: e.package is None)
        yield (
            f"{key}={name!r} needs the {kind.package} package, which this Python cannot "
            f"import: {kind.install}, or use {key}={other}"
        )


def _max_model_len(cfg: RunConfig) -> Iterator[str]:
    """``rollout.max_model_len`` sizes only the engines that read it."""
    r = cfg.rollout
    if r.max_model_len is None or r.backend not in registry.engine_names("generation"):
        return
    if registry.generation_engine(cfg).max_model_len:
        return
    readers = _choices("generation", lambda e: e.max_model_len)
    yield (
        f"rollout.max_model_len={r.max_model_len} sizes a {readers} engine's KV cache, but "
        f"rollout.backend={r.backend!r} generates up to task.max_prompt_length + "
        f"rollout.max_new_tokens; drop it or use rollout.backend={readers}"
    )


@check
def _embodied_actor(cfg: RunConfig) -> Iterator[str]:
    """Actor options a policy network without checkpointed layers would ignore."""
    if cfg.runner not in registry.runner_names() or registry.runner(cfg).language_model:
        return
    if cfg.actor.gradient_checkpointing:
        yield (
            f"actor.gradient_checkpointing=true with runner={cfg.runner!r}: the embodied policy "
            f"is a small network without checkpointed layers; set it to false"
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
        if not _language_model(cfg):
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
    if not _language_model(cfg):
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
    lora = cfg.actor.lora
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
    if not _language_model(cfg):
        yield (
            f"actor.lora.rank={lora.rank} with runner={cfg.runner!r}: LoRA adapts the reasoning "
            f"runner's language-model policy; set actor.lora.rank=0"
        )


#: The capacity of a simulated device when ``cluster.device_memory_gib`` is null.
SIMULATED_DEVICE_GIB = 4.0


def simulated_device_gib(configured: float | None) -> float:
    """The capacity of a simulated device: ``cluster.device_memory_gib``, or 4 GiB when null."""
    return SIMULATED_DEVICE_GIB if configured is None else float(configured)


_LOCAL_GPU_MEMORY: list[int | None] = []


def local_gpu_memory_bytes() -> int | None:
    """Memory of this machine's smallest GPU, in bytes, as ``nvidia-smi`` reports it.

    Read with the driver's own tool rather than torch or NVML so that the driver process
    (which plans before Ray starts) never holds a CUDA context on a device the workers need.
    Read once per process.

    Returns:
        The bytes, or None where the machine shows no GPU (no driver, no ``nvidia-smi``, an
        empty ``CUDA_VISIBLE_DEVICES``, or a tool that fails).
    """
    if not _LOCAL_GPU_MEMORY:
        _LOCAL_GPU_MEMORY.append(_read_nvidia_smi())
    return _LOCAL_GPU_MEMORY[0]


def _read_nvidia_smi() -> int | None:
    import shutil
    import subprocess

    tool = shutil.which("nvidia-smi")
    if tool is None or os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return None
    try:
        out = subprocess.run(
            [tool, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        mib = [int(float(line)) for line in out.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(mib) * 2**20 if mib else None
