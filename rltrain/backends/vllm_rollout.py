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

The rollout worker drives it through :class:`rltrain.backends.generation.VllmGeneration`.
vLLM is imported lazily; without it (or without a GPU) construction fails with a
:class:`~rltrain.errors.ConfigError` / :class:`~rltrain.errors.ResourceError` that says what
to do. The code follows the Python API of vLLM 0.26 (``LLM``, ``SamplingParams``,
``LLM.sleep``, ``LLM.wake_up(tags=...)``, ``LLM.reset_prefix_cache``, ``LLM.collective_rpc``
with a ``worker_extension_cls``, ``logprobs_mode``); it has not yet run on a GPU in this project
(see ``docs/gpu.md``).

Behaviour log-probs come from vLLM's sampler: the engine is built with
``logprobs_mode="processed_logprobs"``, so a sampled token's log-prob is taken after temperature
and top-p, i.e. under the distribution it was drawn from (what the torch engine records).

**The engine core runs in the rollout process.** vLLM V1 by default runs its engine core in a
process of its own and sends every ``LLM.collective_rpc`` argument there through its msgpack
encoder (``vllm/v1/serial_utils.py``), which refuses functions (a CUDA-IPC handle's rebuild
function) unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, turns dataclasses into dicts, and
decodes a tensor argument of a utility call as a plain ``[dtype, shape, buffer index]`` list.
None of the weight payloads would arrive. So, as verl's in-worker engines do, the rollout sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (:data:`ENGINE_ENV`) before building the engine: vLLM
0.26.0's ``LLMEngine.from_engine_args`` reads it and builds an ``InprocClient``, whose calls are
plain Python calls. With tensor parallelism the engine's workers are still processes of their own
(``distributed_executor_backend="mp"``); vLLM hands them ``collective_rpc`` arguments pickled
(``MessageQueue``), which carries every payload here. ``tests/vllm_contract/`` runs these
arguments, the sampling parameters, the prompts and the outputs through vLLM 0.26.0's own code.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.config.offload import OffloadPolicy, resolve_offload
from rltrain.config.seeds import engine_seed, prompt_seed
from rltrain.errors import ConfigError, ResourceError
from rltrain.kinds.vllm import length_problems, vllm_context

#: Qualified name vLLM imports inside each of its workers to add our weight-loading methods.
WORKER_EXTENSION = "rltrain.backends.vllm_rollout.WeightSyncExtension"

#: Set in the rollout process before vLLM builds its engine: the engine core stays in this
#: process (see the module docstring), so weight payloads reach the workers as Python objects.
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

#: vLLM's finish reasons (``CompletionOutput.finish_reason``) for a stop token and the budget.
FINISH_STOP, FINISH_LENGTH = "stop", "length"


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
        stop_token_ids: the EOS ids that end a completion (the tokenizer's and the generation
            config's; vLLM loads no tokenizer: prompts arrive as token ids, so stopping is by
            id).
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
    stop_token_ids: tuple[int, ...] = ()


def engine_kwargs(settings: VllmSettings) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM(...)`` for one engine.

    Args:
        settings: the engine's settings.

    Returns:
        Arguments vLLM 0.26.0's ``LLM`` takes (its own or ``EngineArgs`` fields).
    """
    return {
        "model": settings.model_path,
        "skip_tokenizer_init": True,  # prompts arrive as ids; rltrain decodes with its tokenizer
        "tensor_parallel_size": settings.tensor_parallel_size,
        # One engine per rollout process, which spans its TP devices: vLLM's own processes,
        # not a Ray cluster of its own inside ours.
        "distributed_executor_backend": "mp" if settings.tensor_parallel_size > 1 else None,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "dtype": settings.dtype,
        "seed": settings.seed,
        "enable_sleep_mode": settings.sleep_level > 0,
        "enable_prefix_caching": settings.enable_prefix_caching,
        "max_model_len": settings.max_model_len,
        "load_format": settings.load_format,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": WORKER_EXTENSION,
    }


def sampling_kwargs(
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int | None,
    logprobs: bool,
    stop_token_ids: Sequence[int],
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.SamplingParams(...)`` for one generate call.

    Args:
        n: completions per prompt.
        temperature / top_p / max_new_tokens: the sampling settings (``temperature=0`` is
            greedy in vLLM).
        seed: the request's seed (:func:`prompt_sampling_kwargs`: one per prompt), or None.
        logprobs: also return each sampled token's log-prob (``logprobs=0``: the sampled
            token's only).
        stop_token_ids: the EOS ids; vLLM keeps the one it stopped on in ``token_ids``.
    """
    return {
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_new_tokens,
        "seed": seed,
        "logprobs": 0 if logprobs else None,
        "stop_token_ids": list(stop_token_ids) or None,
        "detokenize": False,
    }


def prompt_sampling_kwargs(count: int, *, seed: int | None, **common: Any) -> list[dict[str, Any]]:
    """The ``vllm.SamplingParams(...)`` arguments of each of a call's ``count`` prompts.

    Every prompt gets its own seed (:func:`~rltrain.config.seeds.prompt_seed` of the call's
    ``seed`` and the prompt's index): vLLM seeds sample ``i`` of a prompt with the prompt's
    seed ``+ i`` and draws its noise from that seed and the position only, so prompts sharing
    one seed would share their noise, and so would the ranks of a step.

    Args:
        count: prompts in the call.
        seed: the call's sampling seed, or None (vLLM's own randomness, the same for all).
        common: the other arguments of :func:`sampling_kwargs` (``n`` among them).

    Returns:
        One argument dict per prompt, in the prompts' order.
    """
    n = int(common["n"])
    return [
        sampling_kwargs(seed=None if seed is None else prompt_seed(seed, i, n), **common)
        for i in range(count)
    ]


def keep_engine_in_process() -> None:
    """Make the vLLM engine built next in this process keep its engine core here
    (:data:`ENGINE_ENV`; see the module docstring). vLLM reads the variable when the engine is
    built (and caches it from then on), so this runs before ``vllm.LLM(...)``."""
    os.environ.update(ENGINE_ENV)


@dataclass(frozen=True)
class Completion:
    """One sampled completion as vLLM returned it.

    Attributes:
        token_ids: the generated tokens. vLLM 0.26 keeps the stop token it sampled (an EOS id
            or one of ``stop_token_ids``) as the last of them.
        logprobs: the sampled tokens' log-probs (processed: temperature and top-p applied),
            one per token, or None when not asked for.
        finish_reason: vLLM's: ``stop`` (a stop token), ``length`` (``max_tokens`` or the
            model's length reached), or another (``abort``, ...).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: str | None

    @property
    def stopped(self) -> bool:
        """Whether the completion ended on a stop token."""
        return self.finish_reason == FINISH_STOP

    @property
    def truncated(self) -> bool:
        """Whether the token budget cut the completion before any stop token."""
        return self.finish_reason == FINISH_LENGTH


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
        keep_engine_in_process()
        vllm = import_vllm()
        require_gpus(settings.tensor_parallel_size)
        self.settings = settings
        self._vllm = vllm
        self.llm = vllm.LLM(**engine_kwargs(settings))
        check_in_process(self.llm)
        self.asleep = False
        self.weights_asleep = False

    # ------------------------------------------------------------------------------ sleep/wake
    def sleep(self) -> None:
        """Free the GPU at the configured level (a no-op at level 0 or when all asleep).

        Weights woken without the KV cache (a weight load with no generate after it: an
        evaluation's catch-up on the ranks that do not evaluate) leave vLLM half asleep, and
        vLLM ignores ``sleep`` while any tag still sleeps. So the KV cache is woken first (the
        rollout's own reservation, which the memory ledger still counts while this process
        holds its state) and the engine then sleeps whole: the weights really leave.
        """
        if self.settings.sleep_level == 0 or self.weights_asleep:
            return
        self.wake_kv_cache()
        self.llm.sleep(level=self.settings.sleep_level)
        self.asleep = self.weights_asleep = True

    def wake_weights(self) -> None:
        """Bring back the weights only (before writing new ones)."""
        if self.weights_asleep:
            self.llm.wake_up(tags=["weights"])
            self.weights_asleep = False

    def wake_kv_cache(self) -> None:
        """Bring back the KV cache (after the new weights are in); wakes the weights first if
        they still sleep, so the engine is whole."""
        self.wake_weights()
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    # ------------------------------------------------------------------------------ weights
    def load_weights_ipc(self, payloads: Mapping[int, Any], rank_map: Mapping[int, int]) -> int:
        """Write new weights from CUDA IPC payloads, each TP worker reading its own GPU's.

        Wakes the weights first (not the KV cache: see the module docstring).

        Args:
            payloads: actor rank -> :class:`~rltrain.backends.weight_sync.ipc.IpcPayload`.
            rank_map: this engine's worker rank -> actor rank (``collocated_rank_map``).

        Returns:
            Tensors loaded, summed over the engine's workers.
        """
        self.wake_weights()
        counts = self.llm.collective_rpc("rltrain_load_ipc", args=(dict(payloads), dict(rank_map)))
        self.llm.reset_prefix_cache()
        return int(sum(counts))

    def load_weights_host(self, packed: Any) -> int:
        """Write new weights from host buckets (:class:`~...weight_sync.host.HostBuckets`).

        Returns:
            Tensors loaded, summed over the engine's workers.
        """
        self.wake_weights()
        counts = self.llm.collective_rpc("rltrain_load_host", args=(packed,))
        self.llm.reset_prefix_cache()
        return int(sum(counts))

    def join_sync(
        self, backend: str, host: str, port: int, world_size: int, first_rank: int, timeout_s: float
    ) -> None:
        """Make every TP worker of the engine a member of a broadcast sync group.

        Worker ``k`` takes group rank ``first_rank + k`` (the actor's source rank is 0).
        """
        self.llm.collective_rpc(
            "rltrain_join_sync", args=(backend, host, port, world_size, first_rank, timeout_s)
        )

    def receive_versions(self, current: int, target: int) -> int:
        """Take every broadcast version after ``current`` up to ``target`` into the weights.

        Returns:
            The version held afterwards.
        """
        self.wake_weights()
        versions = self.llm.collective_rpc("rltrain_receive", args=(current, target))
        self.llm.reset_prefix_cache()
        return int(min(versions))

    # ------------------------------------------------------------------------------ generate
    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        *,
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int | None = None,
        logprobs: bool = False,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt (the KV cache is woken first).

        Args:
            prompt_token_ids: the prompts, as token ids.
            n: completions per prompt (``rollout.n_samples_per_prompt``).
            temperature / top_p / max_new_tokens: sampling settings from ``rollout``;
                ``temperature=0`` is greedy.
            seed: the call's sampling seed (reproducible sampling per step and rank); each
                prompt gets its own (:func:`prompt_sampling_kwargs`). None: vLLM's own.
            logprobs: also return each sampled token's log-prob.

        Returns:
            For each prompt, ``n`` completions.
        """
        self.wake_kv_cache()
        params = [
            self._vllm.SamplingParams(**kwargs)
            for kwargs in prompt_sampling_kwargs(
                len(prompt_token_ids),
                n=n,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                seed=seed,
                logprobs=logprobs,
                stop_token_ids=self.settings.stop_token_ids,
            )
        ]
        # vLLM pairs a list of parameters with the prompts one by one
        outputs = self.llm.generate(token_prompts(prompt_token_ids), params, use_tqdm=False)
        return [[completion_of(c, logprobs) for c in out.outputs] for out in outputs]


def check_in_process(llm: Any) -> None:
    """Refuse an engine whose core runs in another process (the weight payloads would not
    cross vLLM's encoder; see the module docstring).

    Raises:
        ConfigError: vLLM built a multiprocess client despite :data:`ENGINE_ENV` (vLLM was
            imported and its environment cached before the rollout set it).
    """
    client = type(llm.llm_engine.engine_core).__name__
    if client != "InprocClient":
        raise ConfigError(
            f"rollout.backend=vllm: vLLM's engine core runs behind a {client}, in another "
            f"process, where the weight-sync payloads cannot go; rltrain sets "
            f"VLLM_ENABLE_V1_MULTIPROCESSING=0 before building the engine, but vLLM had read "
            f"its environment earlier in this process: do not build another vLLM engine in "
            f"the rollout process first, or set VLLM_ENABLE_V1_MULTIPROCESSING=0 for it"
        )


def token_prompts(prompt_token_ids: Sequence[Sequence[int]]) -> list[dict[str, list[int]]]:
    """The prompts as vLLM's ``TokensPrompt`` dicts (no text: vLLM loads no tokenizer)."""
    return [{"prompt_token_ids": [int(t) for t in p]} for p in prompt_token_ids]


def completion_of(c: Any, logprobs: bool) -> Completion:
    """Read one of vLLM's ``CompletionOutput`` records.

    Args:
        c: the output: ``token_ids``, ``logprobs`` (one ``{token id: Logprob}`` per generated
            token, holding at least the sampled token; a list or vLLM's ``FlatLogprobs``) and
            ``finish_reason``.
        logprobs: whether log-probs were asked for.
    """
    ids = tuple(int(t) for t in c.token_ids)
    lps = None
    if logprobs:
        lps = tuple(float(step[t].logprob) for step, t in zip(c.logprobs, ids, strict=True))
    return Completion(ids, lps, c.finish_reason)


def vllm_settings(
    run: Any, model_path: str, stop_token_ids: Sequence[int], rank: int = 0
) -> VllmSettings:
    """The engine settings of one rollout process of a run.

    ``rollout.max_model_len`` (null: ``task.max_prompt_length + rollout.max_new_tokens``,
    capped at the model's context: :func:`rltrain.placement.memory.sequence_length`) is passed
    to the engine; weights are dummy (the actor's arrive by weight sync before the first
    generation); the rollout's offload policy decides whether the engine sleeps (level 1:
    weights backed up in host memory, KV cache dropped; level 2 would drop the weights too, and
    an evaluation or an eviction between two weight versions would then find none).

    Args:
        run: the run config.
        model_path: a directory with the model's ``config.json``.
        stop_token_ids: the EOS ids (:func:`~rltrain.backends.generation.eos_token_ids`).
        rank: the rollout rank (seeds the engine: :func:`~rltrain.config.seeds.engine_seed`).
    """
    from rltrain.placement.memory import model_dims, sequence_length

    r = run.rollout
    policy = resolve_offload(run.placement.offload.get("rollout"), "placement.offload.rollout")
    return VllmSettings(
        model_path=model_path,
        tensor_parallel_size=r.tensor_parallel_size,
        gpu_memory_utilization=r.gpu_memory_utilization,
        dtype=run.model.dtype,
        seed=engine_seed(run.seed, rank),
        sleep_level=sleep_level_for(policy, weights_resynced_on_wake=False),
        # null: prompt + response capped at the context, the length the plan sized the KV for
        max_model_len=r.max_model_len or sequence_length(run, model_dims(run.model)),
        load_format="dummy",
        stop_token_ids=tuple(stop_token_ids),
    )


def check_vllm_memory(run: Any, plan: Any, weights_bytes: int) -> None:
    """Check ``rollout.gpu_memory_utilization`` against the plan on every rollout device.

    Args:
        run: the run config.
        plan: the resolved plan (device capacities; what other components keep resident on a
            rollout device while it generates).
        weights_bytes: the rollout model's weight bytes (all shards).

    Raises:
        ConfigError: a reservation that cannot hold the weights shard, or does not fit beside
            the state other components keep there (see ``check_rollout_memory``).
    """
    from rltrain.placement.constraints import check_rollout_memory

    if run.rollout.backend != "vllm":
        return
    tp = max(1, run.rollout.tensor_parallel_size)
    devices = sorted(
        {(p.node_rank, d) for p in plan.by_component.get("rollout", ()) for d in p.devices}
    )
    for dev in devices:
        memory = plan.memory.get(dev)
        if memory is None:
            continue
        stage = next((s for s in memory.stages if s.stage == "generate"), None)
        others = 0
        if stage is not None:
            others = sum(
                t.bytes for t in stage.terms if t.component != "rollout" and t.status == "pinned"
            )
        check_rollout_memory(
            run.rollout.gpu_memory_utilization,
            memory.capacity_bytes,
            -(-weights_bytes // tp),
            others,
            device=f"node {dev[0]} device {dev[1]}",
        )


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

    def rltrain_join_sync(
        self, backend: str, host: str, port: int, world: int, first: int, timeout_s: float
    ) -> None:
        from rltrain.backends.weight_sync.collective import SyncGroup

        rank = first + int(self.rank)  # type: ignore[attr-defined]
        self._rltrain_sync = SyncGroup(backend, host, port, world, rank, timeout_s)

    def rltrain_receive(self, current: int, target: int) -> int:
        from rltrain.backends.weight_sync.buckets import unpack_bucket
        from rltrain.backends.weight_sync.transport import receive_versions

        model = self.model_runner.model  # type: ignore[attr-defined]

        def loader(bucket: Any, flat: Any) -> int:
            return len(model.load_weights(weights=list(unpack_bucket(bucket, flat).items())))

        return receive_versions(self._rltrain_sync, loader, current, target)

    def rltrain_load_host(self, packed: Any) -> int:
        from rltrain.backends.weight_sync.buckets import unpack_bucket

        model = self.model_runner.model  # type: ignore[attr-defined]
        device = next(model.parameters()).device
        loaded = 0
        for bucket, flat in zip(packed.layout, packed.flats, strict=True):
            flat = flat.to(device, non_blocking=True)
            loaded += len(model.load_weights(weights=list(unpack_bucket(bucket, flat).items())))
        return loaded


def check_plan_memory(run: Any, plan: Any) -> None:
    """:func:`check_vllm_memory` with the weights the plan's model has, and
    ``rollout.max_model_len`` against the model's context (the vLLM entry's pre-Ray check,
    :mod:`rltrain.kinds.vllm`; the config check could not read a checkpoint that
    ``task.generate`` writes later).

    Raises:
        ConfigError: as :func:`check_vllm_memory`, or an engine length vLLM would refuse
            (:func:`rltrain.kinds.vllm.length_problems`).
    """
    from rltrain.placement import memory as mem

    dims = mem.model_dims(run.model)
    problems = list(length_problems(run, vllm_context(run)))
    if problems:
        raise ConfigError(problems)
    check_vllm_memory(run, plan, mem.weight_bytes(mem.param_count(dims), dims.dtype))
