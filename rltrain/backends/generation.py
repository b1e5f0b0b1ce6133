"""Generation engines: what samples the rollout's responses, behind one small protocol.

The rollout worker owns the calls (which prompts, which step, which weight version) and the
residency interface; a :class:`GenerationEngine` owns the model copy and its device memory:

- :class:`TorchGeneration` (``rollout.backend=torch``): a Hugging Face model on the process's
  device, sampled by :func:`~rltrain.algorithms.sampling.generate`; CPU and GPU.
- :class:`VllmGeneration` (``rollout.backend=vllm``): one vLLM engine per rollout process,
  tensor-parallel over the process's devices, sleeping between rollouts; GPU only, imported
  lazily.

Both load weights through the transport the plan chose (host buckets, CUDA IPC payloads, or a
bucketed broadcast) and return :class:`~rltrain.algorithms.batch.RolloutBatch` rows in the same
layout: ``n`` samples per prompt adjacent, prompts left-padded, responses right-padded after the
EOS (which is part of the response), ``old_logprobs`` of the sampled distribution on request,
``truncated`` where the token budget cut a response. Both stop on every EOS id of the model
(:func:`eos_token_ids`: the tokenizer's and the generation config's), and a response holds only
tokens the engine sampled.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.backends.offload import StateMover
from rltrain.backends.weight_sync.buckets import Bucket, load_bucket
from rltrain.backends.weight_sync.collective import SyncGroup
from rltrain.backends.weight_sync.host import HostBuckets, load_from_host
from rltrain.backends.weight_sync.transport import CollectiveVersion, receive_versions
from rltrain.config import seeds
from rltrain.config.schema import RunConfig
from rltrain.errors import WorkerError
from rltrain.kinds import registry
from rltrain.kinds.records import load


def sampling_seed(run: RunConfig, step: int, rank: int) -> int:
    """The seed of rollout rank ``rank``'s sampling at ``step``: a resumed run, and a fused
    rank standing in for rollout rank ``rank``, sample exactly the same
    (:func:`rltrain.config.seeds.sampling_seed`, in ``[0, 2**32)``)."""
    return seeds.sampling_seed(run.seed, step, rank)


def eos_token_ids(tokenizer: Any, model_path: str | None = None) -> tuple[int, ...]:
    """Every id that ends a response: the tokenizer's EOS first, then the ``eos_token_id`` (an
    id or a list) of ``model_path``'s ``generation_config.json``, which vLLM adds to its stop
    ids and transformers' ``generate`` stops on (a chat checkpoint's end-of-turn and
    end-of-text tokens, say).

    Args:
        tokenizer: the policy's tokenizer.
        model_path: the checkpoint directory (``model.path``), or None for a built model.
    """
    out = [int(tokenizer.eos_token_id)]
    file = os.path.join(model_path, "generation_config.json") if model_path else None
    if file and os.path.isfile(file):
        with open(file) as f:
            extra = json.load(f).get("eos_token_id")
        for t in [extra] if isinstance(extra, int) else list(extra or ()):
            if int(t) not in out:
                out.append(int(t))
    return tuple(out)


def sample_seeded(
    model: torch.nn.Module,
    tokenizer: Any,
    params: Any,
    device: torch.device,
    prompts: Sequence[str],
    seed: int,
    eos_ids: Collection[int] | None = None,
    **kwargs: Any,
) -> RolloutBatch:
    """Sample ``params.n`` responses per prompt with the torch sampler, from ``seed``.

    Args:
        model: the policy.
        tokenizer: its tokenizer.
        params: the :class:`~rltrain.algorithms.sampling.SamplingParams`.
        device: where the model is.
        prompts: the prompts.
        seed: the random stream's seed (:func:`sampling_seed`).
        eos_ids: the ids that end a response (:func:`eos_token_ids`); None: the tokenizer's.
        kwargs: passed on to :func:`~rltrain.algorithms.sampling.generate`.

    Returns:
        The batch, on ``device``.
    """
    from rltrain.algorithms.sampling import encode_prompts, generate

    ids, mask = encode_prompts(tokenizer, prompts)
    return generate(
        model,
        ids.to(device),
        mask.to(device),
        params,
        tokenizer.eos_token_id if eos_ids is None else eos_ids,
        tokenizer.pad_token_id,
        torch.Generator(device=device).manual_seed(seed),
        **kwargs,
    )


def sample_own(
    holder: Any,
    prompts: Sequence[str],
    seed: int,
    with_logprobs: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> RolloutBatch:
    """:func:`sample_seeded` with a sampler's own ``model``, ``tokenizer``, ``params``,
    ``device`` and ``eos_ids`` (the torch engine's and a fused rank's).

    Args:
        holder: the sampler holding those five attributes.
        prompts / seed / with_logprobs / should_stop: as :func:`sample_seeded`.

    Returns:
        The batch, on ``holder.device``.
    """
    return sample_seeded(
        holder.model,
        holder.tokenizer,
        holder.params,
        holder.device,
        prompts,
        seed,
        holder.eos_ids,
        with_logprobs=with_logprobs,
        should_stop=should_stop,
    )


def on_host(sample: Callable[[], RolloutBatch]) -> RolloutBatch:
    """``sample()``'s batch moved to the host, and so are the rows of a call paused part way:
    the sampler raises :class:`~rltrain.algorithms.sampling.GenerationStopped` with them on the
    model's device, and the rollout parks them and stitches them to host tensors.

    Args:
        sample: the engine's call, returning its batch on the model's device.

    Returns:
        The batch on the host.

    Raises:
        GenerationStopped: the call was paused (its ``partial`` on the host).
    """
    from rltrain.algorithms.sampling import GenerationStopped

    try:
        return sample().to("cpu")
    except GenerationStopped as stop:
        if stop.partial is None:
            raise
        raise GenerationStopped(stop.partial.to("cpu")) from stop


class GenerationEngine(Protocol):
    """What the rollout worker uses of a generation engine.

    Attributes:
        device: the (first) device the engine computes on.
        mover: the state surface the residency coordinator drives (``offload`` / ``reload`` /
            ``resident_bytes`` / ``host_bytes`` / ``offloaded``); ``kv_cache`` is a kind the
            engine may hold.
        walk_sees_state: True when walking the worker's tensors finds the engine's state (the
            torch engine); False when it lives where the walk cannot see (vLLM's allocator).
        sync_members: processes this engine puts in a broadcast sync group.
        tokenizer: the policy's tokenizer (the worker decodes evaluation answers and carried
            rows with it).
    """

    device: torch.device
    mover: Any
    walk_sees_state: bool
    sync_members: int
    tokenizer: Any

    def generate(
        self,
        prompts: Sequence[str],
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> RolloutBatch:
        """``n`` samples per prompt, on CPU (a paused call's ``partial`` rows too)."""

    def continue_rows(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> RolloutBatch:
        """One more response per row of left-padded token prompts (a paused generation's rows,
        each prompt followed by its response so far: ``trainer.partial_rollout=continue``), at
        most ``max_new_tokens`` long, on CPU (a paused call's ``partial`` rows too),
        ``group_size`` 1."""

    def evaluate(self, task: Any) -> float:
        """Greedy accuracy on the task's evaluation prompts."""

    def load(self, weights: Any) -> int:
        """Write handed-over weights (host buckets, or IPC payloads in device order)."""

    def join_sync(
        self, backend: str, host: str, port: int, world: int, first: int, timeout_s: float
    ) -> None:
        """Join a broadcast sync group as ranks ``first ..``."""

    def receive(self, current: int, target: int) -> int:
        """Take broadcast versions after ``current`` up to ``target``; returns the version."""


def greedy_accuracy_of(engine: Any, tokenizer: Any, task: Any, batch_size: int = 256) -> float:
    """Share of the task's evaluation prompts whose greedy response earns the full reward.

    Args:
        engine: anything with ``greedy_batch(prompts) -> RolloutBatch`` and ``eos_ids`` (the
            vLLM engine).
        tokenizer: the policy's tokenizer.
        task: the task (``eval`` examples and ``reward``).
        batch_size: prompts per call.
    """
    from rltrain.algorithms.sampling import decode_responses

    items = list(task.eval)
    if not items:
        return 0.0
    correct = 0
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        batch = engine.greedy_batch([ex.prompt for ex in chunk])
        texts = decode_responses(tokenizer, batch, engine.eos_ids)
        correct += sum(task.reward(ex.prompt, t) >= 1.0 for ex, t in zip(chunk, texts, strict=True))
    return correct / len(items)


# ----------------------------------------------------------------------------------- torch
class TorchReceiver:
    """A frozen Hugging Face model copy on one device that takes weight versions from the actor
    (the torch rollout's and the inference component's model).

    Args:
        run: the checked run config.
        device: the compute device.
    """

    walk_sees_state = True
    sync_members = 1

    def __init__(self, run: RunConfig, device: torch.device) -> None:
        from rltrain.tasks import build_tokenizer
        from rltrain.tasks.model import build_model

        self.run = run
        self.device = device
        self.tokenizer = build_tokenizer(run.model)
        self.model = build_model(run.model).to(device)
        self.model.requires_grad_(False)
        self.mover = StateMover(self.model, None, device=device)
        self._group: SyncGroup | None = None

    def _loader(self) -> Callable[[Bucket, torch.Tensor], int]:
        params = dict(self.model.named_parameters())

        def loader(bucket: Bucket, flat: torch.Tensor) -> int:
            return load_bucket(bucket, flat, params)

        return loader

    def load(self, weights: Any) -> int:
        """Write host buckets, or the IPC payload of the actor rank on this device."""
        if isinstance(weights, HostBuckets):
            return load_from_host(weights, dict(self.model.named_parameters()))
        from rltrain.backends.weight_sync.ipc import receive_ipc

        (payload,) = weights  # one device: the actor rank on it
        return receive_ipc(payload, dict(self.model.named_parameters()))

    def join_sync(
        self, backend: str, host: str, port: int, world: int, first: int, timeout_s: float
    ) -> None:
        """Join a broadcast sync group as rank ``first``."""
        self._group = SyncGroup(backend, host, port, world, first, timeout_s)

    def receive(self, current: int, target: int) -> int:
        """Take broadcast versions after ``current`` up to ``target``; returns the version.

        Raises:
            WorkerError: the group was not joined.
        """
        if self._group is None:
            raise WorkerError("weight sync: the collective group was not joined before receive")
        return receive_versions(self._group, self._loader(), current, target)


class TorchGeneration(TorchReceiver):
    """A Hugging Face model sampled by rltrain's sampler (the CPU default).

    Args:
        run: the checked run config.
        device: the compute device.
    """

    def __init__(self, run: RunConfig, device: torch.device) -> None:
        from rltrain.algorithms.sampling import SamplingParams

        super().__init__(run, device)
        self.params = SamplingParams.from_rollout(run.rollout)
        self.eos_ids = eos_token_ids(self.tokenizer, run.model.path)

    def generate(
        self,
        prompts: Sequence[str],
        seed: int,
        with_logprobs: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> RolloutBatch:
        return on_host(lambda: sample_own(self, prompts, seed, with_logprobs, should_stop))

    def continue_rows(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        seed: int,
        with_logprobs: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> RolloutBatch:
        """See :meth:`GenerationEngine.continue_rows`: the sampler recomputes the rows' prefix
        with the weights held (no KV cache survives a weight swap) and samples on."""
        import dataclasses

        from rltrain.algorithms.sampling import generate

        params = dataclasses.replace(self.params, n=1, max_new_tokens=max_new_tokens)
        return on_host(
            lambda: generate(
                self.model,
                prompt_ids.to(self.device),
                prompt_mask.to(self.device),
                params,
                self.eos_ids,
                self.tokenizer.pad_token_id,
                torch.Generator(device=self.device).manual_seed(seed),
                with_logprobs=with_logprobs,
                should_stop=should_stop,
            )
        )

    def evaluate(self, task: Any) -> float:
        from rltrain.algorithms.sampling import greedy_accuracy

        return greedy_accuracy(
            self.model, self.tokenizer, task, self.run.rollout.max_new_tokens, eos_ids=self.eos_ids
        )


# ------------------------------------------------------------------------------------ vLLM
def model_dir_for_vllm(run: RunConfig, tokenizer: Any) -> str:
    """A directory vLLM can build the policy's architecture from.

    With ``model.path`` that checkpoint; for the built model (``model.path=null``) its config
    is written to a fresh local directory (vLLM starts from dummy weights; the actor's arrive by
    weight sync before the first generation).
    """
    if run.model.path:
        return run.model.path
    from rltrain.tasks.model import tiny_model_config

    config = tiny_model_config(run.model, tokenizer)
    config.architectures = [
        {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[run.model.family]
    ]
    config.dtype = run.model.dtype  # transformers 5 (``torch_dtype`` is its deprecated alias)
    path = tempfile.mkdtemp(prefix="rltrain-vllm-model-")
    config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def model_weight_bytes(model_path: str, dtype: str) -> int:
    """Bytes of the model's weights in ``dtype``, counted on the meta device (no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rltrain.tasks.model import resolve_dtype

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    size = torch.empty(0, dtype=resolve_dtype(dtype)).element_size()
    return sum(p.numel() for p in model.parameters()) * size


def batch_from_completions(
    prompt_ids: Sequence[Sequence[int]],
    completions: Sequence[Sequence[Any]],
    pad_token_id: int,
    with_logprobs: bool = False,
) -> RolloutBatch:
    """Lay vLLM's completions out as a rollout batch, as the torch sampler does.

    Nothing is added that the engine did not sample. vLLM 0.26 returns the stop token it
    sampled (any EOS id of :func:`eos_token_ids`) as the completion's last token, with the
    log-prob it was sampled with: it stays, mask 1. A completion that ended on a stop token the
    engine did not return ends there, without one. ``truncated`` is True exactly where vLLM
    ended the completion at the token budget (``finish_reason == "length"``).

    Args:
        prompt_ids: the prompts' token ids (unpadded).
        completions: per prompt, its ``n`` :class:`~rltrain.backends.vllm_rollout.Completion`.
        pad_token_id: pads prompts on the left and responses on the right.
        with_logprobs: fill ``old_logprobs`` from the completions.

    Returns:
        ``B = prompts x n`` rows, ``group_size = n``; ``P`` the longest prompt, ``R`` the
        longest response.

    Raises:
        WorkerError: prompts with different numbers of completions, or none at all; a
            completion without log-probs, or with one per token missing, when they were
            asked for.
    """
    counts = {len(c) for c in completions}
    if len(counts) != 1 or 0 in counts:
        raise WorkerError(f"vLLM returned {sorted(counts)} completions per prompt; expected n")
    n = counts.pop()
    p_len = max(len(p) for p in prompt_ids)
    rows = [(list(p), c) for p, outs in zip(prompt_ids, completions, strict=True) for c in outs]
    r_len = max(1, max(len(c.token_ids) for _, c in rows))
    b = len(rows)
    prompt_t = torch.full((b, p_len), pad_token_id, dtype=torch.long)
    prompt_m = torch.zeros((b, p_len), dtype=torch.long)
    resp_t = torch.full((b, r_len), pad_token_id, dtype=torch.long)
    resp_m = torch.zeros((b, r_len), dtype=torch.float32)
    logp = torch.zeros((b, r_len), dtype=torch.float32)
    for i, (prompt, c) in enumerate(rows):
        ids = list(c.token_ids)
        if prompt:
            prompt_t[i, p_len - len(prompt) :] = torch.tensor(prompt)
            prompt_m[i, p_len - len(prompt) :] = 1
        if ids:
            resp_t[i, : len(ids)] = torch.tensor(ids)
            resp_m[i, : len(ids)] = 1.0
        if with_logprobs:
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise WorkerError(
                    f"vLLM returned {len(c.logprobs or ())} log-probs for {len(ids)} tokens; "
                    f"the rollout asked for the sampled token's log-prob at every position"
                )
            logp[i, : len(ids)] = torch.tensor(c.logprobs, dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=prompt_t,
        prompt_mask=prompt_m,
        response_ids=resp_t,
        response_mask=resp_m,
        group_size=n,
        old_logprobs=logp if with_logprobs else None,
        truncated=torch.tensor([c.truncated for _, c in rows], dtype=torch.bool),
    )


class VllmState:
    """The residency surface of a vLLM engine: offload = ``sleep``, reload = wake the weights.

    The KV cache wakes only when the next generation starts (after any new weights are written),
    so old weights, new weights and the cache never sit on the device together. vLLM has no
    level that frees the KV cache alone: any offload sleeps the engine (weights to host memory
    at level 1, KV cache dropped).

    Args:
        engine: the :class:`~rltrain.backends.vllm_rollout.VllmRollout`.
        weights_bytes: the engine's weight bytes per device.
        kv_bytes: the KV cache it reserves per device.
    """

    def __init__(self, engine: Any, weights_bytes: int, kv_bytes: int) -> None:
        self.engine = engine
        self.weights_bytes = weights_bytes
        self.kv_bytes = kv_bytes

    @property
    def offloaded(self) -> frozenset[str]:
        out = set()
        if self.engine.weights_asleep:
            out.add("weights")
        if self.engine.asleep:
            out.add("kv_cache")
        return frozenset(out)

    def offload(self, kinds: Iterable[str]) -> int:
        before = sum(self.resident_bytes().values())
        if {"weights", "kv_cache"} & set(kinds):
            self.engine.sleep()
        return before - sum(self.resident_bytes().values())

    def reload(self, kinds: Iterable[str] | None = None) -> int:
        before = sum(self.resident_bytes().values())
        self.engine.wake_weights()
        return sum(self.resident_bytes().values()) - before

    def resident_bytes(self) -> dict[str, int]:
        off = self.offloaded
        return {
            "weights": 0 if "weights" in off else self.weights_bytes,
            "kv_cache": 0 if "kv_cache" in off else self.kv_bytes,
        }

    def host_bytes(self) -> dict[str, int]:
        return {"weights": self.weights_bytes if "weights" in self.offloaded else 0}


class VllmGeneration:
    """One vLLM engine for this rollout process (its TP devices), driven by the worker.

    Args:
        run: the checked run config.
        device: the process's first device.
        rank: the rollout rank (seeds the engine).

    Raises:
        ConfigError: vLLM is not installed.
        ResourceError: fewer CUDA GPUs than ``rollout.tensor_parallel_size``.
    """

    walk_sees_state = False

    def __init__(self, run: RunConfig, device: torch.device, rank: int) -> None:
        from rltrain.backends.vllm_rollout import (
            VllmRollout,
            import_vllm,
            require_gpus,
            vllm_settings,
        )
        from rltrain.tasks import build_tokenizer

        import_vllm()
        require_gpus(run.rollout.tensor_parallel_size)
        self.run = run
        # A worker built outside the runtime (a test) has no devices: vLLM takes GPU 0.
        self.device = device if device.type == "cuda" else torch.device("cuda", 0)
        self.sync_members = run.rollout.tensor_parallel_size
        self.tokenizer = build_tokenizer(run.model)
        path = model_dir_for_vllm(run, self.tokenizer)
        self.eos_ids = eos_token_ids(self.tokenizer, run.model.path)
        settings = vllm_settings(run, path, self.eos_ids, rank)
        tp = max(1, settings.tensor_parallel_size)
        weights = -(-model_weight_bytes(path, run.model.dtype) // tp)
        total = torch.cuda.get_device_properties(self.device).total_memory
        self.engine = VllmRollout(settings)
        kv = max(int(settings.gpu_memory_utilization * total) - weights, 0)
        self.mover = VllmState(self.engine, weights, kv)

    def _prompt_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        from rltrain.tasks.tokenizer import prompt_token_ids

        return prompt_token_ids(self.tokenizer, prompts)  # as the torch sampler encodes them

    def generate(
        self,
        prompts: Sequence[str],
        seed: int,
        with_logprobs: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> RolloutBatch:
        from rltrain.algorithms.sampling import GenerationStopped

        if should_stop is not None and should_stop():
            raise GenerationStopped  # vLLM's call runs to its end once started
        r = self.run.rollout
        ids = self._prompt_ids(prompts)
        outs = self.engine.generate(
            ids,
            n=r.n_samples_per_prompt,
            temperature=r.temperature,
            top_p=r.top_p,
            max_new_tokens=r.max_new_tokens,
            seed=seed,
            logprobs=with_logprobs,
        )
        return batch_from_completions(ids, outs, self.tokenizer.pad_token_id, with_logprobs)

    def continue_rows(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        seed: int,
        with_logprobs: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> RolloutBatch:
        """See :meth:`GenerationEngine.continue_rows`: the rows go to vLLM as token prompts
        (:func:`continuation_token_ids`), which prefills them with the weights it holds. Like
        :meth:`generate`, a call stops only before it starts: a vLLM call runs to its end."""
        from rltrain.algorithms.sampling import GenerationStopped

        if should_stop is not None and should_stop():
            raise GenerationStopped
        r = self.run.rollout
        ids = continuation_token_ids(prompt_ids, prompt_mask)
        outs = self.engine.generate(
            ids,
            n=1,
            temperature=r.temperature,
            top_p=r.top_p,
            max_new_tokens=max_new_tokens,
            seed=seed,
            logprobs=with_logprobs,
        )
        return batch_from_completions(ids, outs, self.tokenizer.pad_token_id, with_logprobs)

    def greedy_batch(self, prompts: Sequence[str]) -> RolloutBatch:
        ids = self._prompt_ids(prompts)
        outs = self.engine.generate(
            ids, n=1, temperature=0.0, top_p=1.0, max_new_tokens=self.run.rollout.max_new_tokens
        )
        return batch_from_completions(ids, outs, self.tokenizer.pad_token_id)

    def evaluate(self, task: Any) -> float:
        return greedy_accuracy_of(self, self.tokenizer, task)

    def load(self, weights: Any) -> int:
        if isinstance(weights, HostBuckets):
            return self.engine.load_weights_host(weights)
        payloads = dict(enumerate(weights))  # device k of the process <- the actor rank there
        return self.engine.load_weights_ipc(payloads, {k: k for k in payloads})

    def join_sync(
        self, backend: str, host: str, port: int, world: int, first: int, timeout_s: float
    ) -> None:
        self.engine.join_sync(backend, host, port, world, first, timeout_s)

    def receive(self, current: int, target: int) -> int:
        return self.engine.receive_versions(current, target)


def continuation_token_ids(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Left-padded token prompts as vLLM takes them: each row's real tokens, unpadded.

    Args:
        prompt_ids: ``[b, L]`` long.
        prompt_mask: ``[b, L]``, 1 on real tokens.
    """
    return [
        [int(t) for t, m in zip(row, keep, strict=True) if m]
        for row, keep in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True)
    ]


def build_generation(run: RunConfig, device: torch.device, rank: int) -> GenerationEngine:
    """The engine ``rollout.backend`` names (its entry's runtime, :mod:`rltrain.kinds`)."""
    return load(registry.generation_engine(run).runtime)(run, device, rank)


def torch_generation(run: RunConfig, device: torch.device, rank: int) -> TorchGeneration:
    """The torch generation engine (its entry's runtime); one per process, whatever the rank."""
    return TorchGeneration(run, device)


def is_collective(weights: Any) -> bool:
    """Whether handed-over weights are a collective marker (the bytes come by broadcast)."""
    return isinstance(weights, CollectiveVersion)


__all__ = [
    "sample_own",
    "GenerationEngine",
    "TorchGeneration",
    "TorchReceiver",
    "VllmGeneration",
    "VllmState",
    "batch_from_completions",
    "build_generation",
    "continuation_token_ids",
    "eos_token_ids",
    "greedy_accuracy_of",
    "is_collective",
    "model_dir_for_vllm",
    "on_host",
    "sample_seeded",
    "sampling_seed",
]
