"""The rollout worker with the vLLM engine on one GPU: sleep, wake the weights, load new weights
over CUDA IPC, wake the KV cache, generate (skipped without CUDA or vLLM).

The actor's side lives in this test's process (a policy on cuda:0 publishing IPC buckets); vLLM's
engine core runs in this process too, as in a rollout worker (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
the weight payloads are Python objects, never encoded), and its worker opens the handles.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu

PROMPTS = ["1+2=", "3+4=", "0+1=", "4+4="]


def _run():
    from rltrain.config.schema import ModelConfig, OffloadPolicyConfig, RunConfig

    run = RunConfig()
    # head size 64 (vLLM's attention kernels want a common size), bfloat16 like a real policy
    run.model = ModelConfig(
        hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=4, dtype="bfloat16"
    )
    run.rollout.backend = "vllm"
    run.rollout.n_samples_per_prompt = 4
    run.rollout.max_new_tokens = 6
    run.rollout.gpu_memory_utilization = 0.2
    run.task.max_prompt_length = 16
    run.placement.component_placement = {"actor,rollout": "all"}
    run.placement.offload = {
        "rollout": OffloadPolicyConfig(when="after_stage", states=["weights", "kv_cache"])
    }
    return run


def test_vllm_rollout_sleeps_wakes_loads_over_ipc_and_generates() -> None:
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from rltrain.algorithms.logprobs import compute_logprobs
    from rltrain.backends.weight_sync.transport import WeightSender
    from rltrain.placement.transport_choice import TransportChoice
    from rltrain.tasks.model import build_model
    from rltrain.workers.rollout import RolloutWorker

    run = _run()
    worker = RolloutWorker(run)
    choice = TransportChoice("ipc", "test", feeders=((0, (0,)),))
    assert worker.setup_weight_sync(choice) == 1
    policy = build_model(run.model).to("cuda").requires_grad_(False)
    sender = WeightSender(choice, rank=0)

    total = worker.state_bytes()
    assert total["weights"] > 0 and total["kv_cache"] > 0
    free_awake = torch.cuda.mem_get_info()[0]
    worker.offload(["weights", "kv_cache"])  # sleep (level 1)
    freed = torch.cuda.mem_get_info()[0] - free_awake
    assert freed >= 0.9 * total["kv_cache"]
    assert worker.mover.offloaded == {"weights", "kv_cache"}
    worker.reload(["weights", "kv_cache"])  # the weights only: the cache waits for new weights
    assert worker.mover.offloaded == {"kv_cache"}

    weights = {0: sender.export(list(policy.named_parameters()), version=0)}
    batch = worker.generate(PROMPTS, step=0, weights=weights, behaviour_logprobs=True)
    assert worker.version == 0 and worker.mover.offloaded == frozenset()
    assert batch.size == len(PROMPTS) * 4 and batch.group_size == 4
    # The sampler's log-probs are the policy's: the new weights are what vLLM sampled with.
    b = batch.to("cuda")
    want = compute_logprobs(policy, b.input_ids, b.attention_mask, b.response_mask)
    torch.testing.assert_close(batch.rollout_logprobs, want.float().cpu(), atol=0.1, rtol=0.05)

    # A second version after another sleep: wake weights, write, wake cache, generate.
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(0.5)
    worker.offload(["weights", "kv_cache"])
    worker.reload(["weights"])
    weights = {0: sender.export(list(policy.named_parameters()), version=1)}
    batch = worker.generate(PROMPTS, step=1, weights=weights, behaviour_logprobs=True)
    b = batch.to("cuda")
    want = compute_logprobs(policy, b.input_ids, b.attention_mask, b.response_mask)
    torch.testing.assert_close(batch.rollout_logprobs, want.float().cpu(), atol=0.1, rtol=0.05)
    report = worker.memory_report()
    assert report["declared"] == sum(total.values())
    assert type(worker.engine.engine.llm.llm_engine.engine_core).__name__ == "InprocClient"
    # outside Ray nobody acknowledges the loads: both versions' buckets are still held
    held = sender.device_bytes
    assert held == 2 * weights[0].nbytes
    assert sender.release() == held and sender.device_bytes == 0
