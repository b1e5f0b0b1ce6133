"""vLLM rollout backend: one engine per rollout process group, sleeping between rollouts.

``rollout.backend=vllm`` generates with a vLLM ``LLM`` engine. One engine serves one rollout
process group of ``rollout.tensor_parallel_size`` GPUs (the placement's model-parallel groups).
It is built with ``enable_sleep_mode`` and follows the hybrid-engine dance:

1. :meth:`VllmRollout.wake_weights` — ``wake_up(tags=["weights"])``: only the weights return;
2. :meth:`VllmRollout.load_weights_ipc` / :meth:`load_weights_host` — new weights are written
   in place (each TP worker takes its shard on its own GPU); the prefix cache is reset, since
   cached KV blocks were computed with the old weights;
3. :meth:`VllmRollout.wake_kv_cache` — ``wake_up(tags=["kv_cache"])``: the cache comes back
   only now, so old weights, new weights and the cache never sit on the GPU together;
4. :meth:`VllmRollout.generate`, then :meth:`VllmRollout.sleep` at the level the offload policy
   implies (:func:`sleep_level_for`).

vLLM is imported lazily; without it (or without a GPU) construction fails with a
:class:`~rltrain.errors.ConfigError` / :class:`~rltrain.errors.ResourceError` that says what
to do. The code follows vLLM's documented Python API (``LLM``, ``SamplingParams``,
``LLM.sleep``, ``LLM.wake_up(tags=...)``, ``LLM.reset_prefix_cache``, ``LLM.collective_rpc``
with a ``worker_extension_cls``); it has not yet run on a GPU in this project (see
``docs/gpu.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.config.offload import OffloadPolicy
from rltrain.errors import ConfigError, ResourceError

#: Qualified name vLLM imports inside each of its workers to add our weight-loading methods.
WORKER_EXTENSION = "rltrain.backends.vllm_rollout.WeightSyncExtension"


def import_vllm() -> Any:
    """Import vLLM, or explain how to get it.

    Raises:
        ConfigError: when vLLM is not installed.
    """
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(
            f"rollout.backend=vllm needs the vllm package ({exc}): install it on the GPU nodes "
            f"(pip install 'rltrain[vllm]', a build matching the node's torch), or set "
            f"rollout.backend=torch"
        ) from None
    return vllm


def require_gpus(tensor_parallel_size: int) -> None:
    """Refuse to start an engine without the GPUs its TP size needs.

    Raises:
        ResourceError: when CUDA is missing or fewer GPUs are visible than the TP size.
    """
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < tensor_parallel_size:
        raise ResourceError(
            f"rollout.backend=vllm with rollout.tensor_parallel_size={tensor_parallel_size} needs "
            f"{tensor_parallel_size} CUDA GPU(s) in the rollout process, found {visible}: run on "
            f"GPU nodes (cluster.simulate_devices=false) or set rollout.backend=torch"
        )


def sleep_level_for(policy: OffloadPolicy, weights_resynced_on_wake: bool) -> int:
    """The vLLM sleep level an offload policy implies.

    Args:
        policy: the rollout's resolved offload policy.
        weights_resynced_on_wake: whether new weights are written after every wake (an
            on-policy loop syncs weights before each rollout).

    Returns:
        0 to stay awake; 1 to back the weights up in host memory and drop the KV cache;
        2 to drop both (the weights are about to be overwritten anyway, so copying them to the
        host would be wasted work).
    """
    if not policy.enabled:
        return 0
    if "weights" in policy.states and weights_resynced_on_wake:
        return 2
    # vLLM has no "KV cache only" level: level 1 is the lightest that frees the cache.
    return 1


@dataclass(frozen=True)
class VllmSettings:
    """One engine's settings, from the ``rollout`` and ``model`` config sections.

    Attributes:
        model_path: a local Hugging Face checkpoint directory (``model.path``).
        tensor_parallel_size: ``rollout.tensor_parallel_size`` (GPUs of this engine).
        gpu_memory_utilization: ``rollout.gpu_memory_utilization``.
        dtype: ``model.dtype``.
        seed: the engine's sampling seed.
        sleep_level: from :func:`sleep_level_for`; 0 disables sleep mode.
        enable_prefix_caching: share KV blocks across prompts of a group.
        max_model_len: the longest prompt + completion, or None for the model's.
        load_format: ``auto``, or ``dummy`` for random weights (synced from the actor later).
    """

    model_path: str
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.3
    dtype: str = "bfloat16"
    seed: int = 0
    sleep_level: int = 1
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    load_format: str = "auto"


class VllmRollout:
    """A vLLM engine driven through the hybrid-engine dance (see the module docstring).

    Args:
        settings: the engine's settings.

    Raises:
        ConfigError: when vLLM is missing or the settings are invalid.
        ResourceError: when the GPUs are missing.
    """

    def __init__(self, settings: VllmSettings) -> None:
        if settings.sleep_level not in (0, 1, 2):
            raise ConfigError(f"vLLM sleep_level={settings.sleep_level} must be 0, 1 or 2")
        vllm = import_vllm()
        require_gpus(settings.tensor_parallel_size)
        self.settings = settings
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=settings.model_path,
            tensor_parallel_size=settings.tensor_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            dtype=settings.dtype,
            seed=settings.seed,
            enable_sleep_mode=settings.sleep_level > 0,
            enable_prefix_caching=settings.enable_prefix_caching,
            max_model_len=settings.max_model_len,
            load_format=settings.load_format,
            worker_extension_cls=WORKER_EXTENSION,
        )
        self.asleep = False

    # ------------------------------------------------------------------------------ sleep/wake
    def sleep(self) -> None:
        """Free the GPU at the configured level (a no-op at level 0 or when asleep)."""
        if self.settings.sleep_level == 0 or self.asleep:
            return
        self.llm.sleep(level=self.settings.sleep_level)
        self.asleep = True

    def wake_weights(self) -> None:
        """Bring back the weights only (before writing new ones)."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])

    def wake_kv_cache(self) -> None:
        """Bring back the KV cache (after the new weights are in)."""
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    # ------------------------------------------------------------------------------ weights
    def load_weights_ipc(self, payloads: Mapping[int, Any], rank_map: Mapping[int, int]) -> int:
        """Write new weights from CUDA IPC payloads, each TP worker reading its own GPU's.

        Args:
            payloads: actor rank -> :class:`~rltrain.backends.weight_sync.ipc.IpcPayload`.
            rank_map: this engine's worker rank -> actor rank (``collocated_rank_map``).

        Returns:
            Tensors loaded, summed over the engine's workers.
        """
        counts = self.llm.collective_rpc("rltrain_load_ipc", args=(dict(payloads), dict(rank_map)))
        self.llm.reset_prefix_cache()
        return int(sum(counts))

    def load_weights_host(self, packed: Any) -> int:
        """Write new weights from host buckets (:class:`~...weight_sync.host.HostBuckets`).

        Returns:
            Tensors loaded, summed over the engine's workers.
        """
        counts = self.llm.collective_rpc("rltrain_load_host", args=(packed,))
        self.llm.reset_prefix_cache()
        return int(sum(counts))

    # ------------------------------------------------------------------------------ generate
    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        *,
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> list[list[list[int]]]:
        """Sample ``n`` completions per prompt.

        Args:
            prompt_token_ids: the prompts, as token ids.
            n: completions per prompt (``rollout.n_samples_per_prompt``).
            temperature / top_p / max_new_tokens: sampling settings from ``rollout``.

        Returns:
            For each prompt, ``n`` completions as token ids.
        """
        params = self._vllm.SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens
        )
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[list(c.token_ids) for c in out.outputs] for out in outputs]


class WeightSyncExtension:
    """Methods vLLM mixes into each of its workers (``worker_extension_cls``).

    They run inside the worker processes, where ``self.model_runner.model`` is the model shard
    and ``self.rank`` the worker's rank in its engine; ``load_weights`` of vLLM's models takes
    full tensors and slices out this worker's TP shard.
    """

    def rltrain_load_ipc(self, payloads: dict[int, Any], rank_map: dict[int, int]) -> int:
        from rltrain.backends.weight_sync.buckets import unpack_bucket
        from rltrain.backends.weight_sync.ipc import receive_ipc, select_payload

        model = self.model_runner.model  # type: ignore[attr-defined]
        payload = select_payload(payloads, rank_map, self.rank)  # type: ignore[attr-defined]

        def loader(bucket: Any, flat: Any) -> int:
            return len(model.load_weights(weights=list(unpack_bucket(bucket, flat).items())))

        return receive_ipc(payload, loader=loader)

    def rltrain_load_host(self, packed: Any) -> int:
        from rltrain.backends.weight_sync.buckets import unpack_bucket

        model = self.model_runner.model  # type: ignore[attr-defined]
        device = next(model.parameters()).device
        loaded = 0
        for bucket, flat in zip(packed.layout, packed.flats, strict=True):
            flat = flat.to(device, non_blocking=True)
            loaded += len(model.load_weights(weights=list(unpack_bucket(bucket, flat).items())))
        return loaded
