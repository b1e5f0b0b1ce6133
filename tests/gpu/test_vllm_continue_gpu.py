"""``trainer.partial_rollout=continue`` with the vLLM engine on one GPU: a generation paused
after two tokens goes on with new weights (loaded over CUDA IPC); each token's behaviour log-prob
is that of the weights that sampled it (skipped without CUDA or vLLM).

A vLLM call runs to its end once started, so the pause is made the way the worker keeps one: the
first two columns of a finished generation, the rows without an EOS in them still decoding.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu

PROMPTS = ["1+2=", "3+4=", "0+1=", "4+4="]


def _run():
    """The vLLM rollout test's setting (tests/gpu/test_vllm_rollout_gpu.py), continuing."""
    from rltrain.config.schema import ModelConfig, RunConfig

    run = RunConfig()
    run.model = ModelConfig(
        hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=4, dtype="bfloat16"
    )
    run.rollout.backend = "vllm"
    run.rollout.n_samples_per_prompt = 4
    run.rollout.max_new_tokens = 6
    run.rollout.gpu_memory_utilization = 0.2
    run.task.max_prompt_length = 16
    run.placement.component_placement = {"actor,rollout": "all"}
    run.trainer.max_staleness = 1
    run.trainer.partial_rollout = "continue"
    return run


def test_vllm_continues_a_paused_generation_under_new_weights() -> None:
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from rltrain.algorithms.logprobs import compute_logprobs
    from rltrain.backends import continuation
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

    weights = {0: sender.export(list(policy.named_parameters()), version=0)}
    first = worker.generate(PROMPTS, step=0, weights=weights)
    cut = first.replace(
        response_ids=first.response_ids[:, :2],
        response_mask=first.response_mask[:, :2],
        old_logprobs=first.rollout_logprobs[:, :2],
        rollout_logprobs=None,
        token_versions=None,
        truncated=first.response_mask[:, :2].sum(dim=1) == 2,  # no EOS in the first two
    )
    cut = cut.replace(truncated=cut.truncated & ~torch.isin(cut.response_ids[:, 1], _eos(worker)))
    worker._parked[1] = continuation.park(cut, version=0, started=0)

    old_policy = {n: p.detach().clone() for n, p in policy.named_parameters()}
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(0.5)
    weights = {0: sender.export(list(policy.named_parameters()), version=1)}
    out = worker.generate(PROMPTS, step=1, weights=weights, resume=True)
    assert worker.version == 1 and out is not None and 1 not in worker._parked
    assert torch.equal(out.response_ids[:, :2], cut.response_ids)
    live = out.response_mask.bool()
    assert (out.token_versions[:, :2][live[:, :2]] == 0).all()
    v1 = live & (out.token_versions == 1)
    assert v1.any()
    b = out.to("cuda")
    new_lp = compute_logprobs(policy, b.input_ids, b.attention_mask, b.response_mask).float().cpu()
    torch.testing.assert_close(out.rollout_logprobs[v1], new_lp[v1], atol=0.1, rtol=0.05)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            p.copy_(old_policy[n])
    old_lp = compute_logprobs(policy, b.input_ids, b.attention_mask, b.response_mask).float().cpu()
    v0 = live & (out.token_versions == 0)
    torch.testing.assert_close(out.rollout_logprobs[v0], old_lp[v0], atol=0.1, rtol=0.05)
    sender.release()


def _eos(worker) -> torch.Tensor:
    return torch.tensor(worker.engine.eos_ids)
