"""Where host tensors meet a model on the GPU (skipped without CUDA): the two places found on CPU
with a stand-in device after the 2026-11-27 lease, run on a real one.

- The embodied rollout seeds each item's generator on the host; ``torch.multinomial`` refuses a
  host generator for probabilities on a GPU, so the draw is made on the host
  (:func:`rltrain.workers.embodied.categorical_draw`).
- A torch generation paused at a weight swap (``trainer.partial_rollout=continue``) hands its
  rows back on the host, where the rollout parks them and later stitches them to host tensors.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

PROMPTS = ["1+2=", "3+4=", "0+1=", "4+4="]


def test_a_discrete_policy_on_the_gpu_samples_with_an_items_host_generator() -> None:
    from rltrain.workers.embodied import ActorCritic, item_seed
    from rltrain.workers.env import SpaceSpec

    model = ActorCritic(SpaceSpec("CartPole-v1", 4, "discrete", 2), 16, 2).to("cuda")
    obs = torch.randn(256, 4, device="cuda")
    seed = item_seed(1, 3, 0, 1, 7)
    actions, logp = model.act(obs, torch.Generator().manual_seed(seed))
    assert actions.device.type == logp.device.type == "cuda"
    # the same race torch.multinomial runs on the host, on the same probabilities
    probs = model.distribution(obs).probs.detach().cpu()
    want = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(-1)
    assert torch.equal(actions.cpu(), want)


def test_a_paused_torch_generation_on_the_gpu_parks_on_the_host_and_continues() -> None:
    import dataclasses

    from rltrain.config.schema import RunConfig
    from rltrain.workers.rollout import RolloutWorker

    class OnDevice0(RolloutWorker):
        """The worker as the runtime starts it on one GPU (outside it, a worker has no device
        and computes on the CPU)."""

        _rltrain_ctx = dataclasses.replace(RolloutWorker._rltrain_ctx, devices=(0,))

    run = RunConfig()
    run.rollout.n_samples_per_prompt = 4
    run.rollout.max_new_tokens = 12
    run.rollout.temperature = 1.0
    run.placement.component_placement = {"actor,rollout": "all"}
    run.trainer.max_staleness = 1
    run.trainer.partial_rollout = "continue"
    worker = OnDevice0(run)
    assert worker.engine.model.device.type == "cuda"  # type: ignore[attr-defined]

    asked = []

    def pause_after_three() -> bool:  # a weight swap arriving at the fourth decoding step
        asked.append(1)
        return len(asked) > 3

    worker._decode_step = pause_after_three  # type: ignore[method-assign]
    assert worker.generate(PROMPTS, step=0) is None  # paused: nobody reads the result
    parked = worker._parked[0]
    assert parked.batch.response_ids.device.type == "cpu"
    kept = parked.batch.response_ids.shape[1]
    assert 0 < kept < run.rollout.max_new_tokens

    worker._decode_step = lambda: False  # type: ignore[method-assign]
    out = worker.generate(PROMPTS, step=0, resume=True)
    assert out is not None and 0 not in worker._parked
    assert out.response_ids.device.type == "cpu"
    assert torch.equal(out.response_ids[:, :kept], parked.batch.response_ids)
    assert out.response_ids.shape[1] > kept
    assert (out.token_versions[out.response_mask.bool()] == worker.version).all()
