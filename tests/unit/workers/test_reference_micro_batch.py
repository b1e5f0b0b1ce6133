"""The reference worker runs its shards reference.micro_batch_size rows per forward pass, with
the log-probs of the whole shard at once."""

from __future__ import annotations

import torch

from rltrain.algorithms.logprobs import compute_logprobs
from rltrain.algorithms.sampling import SamplingParams
from rltrain.backends.generation import sample_seeded
from rltrain.config.schema import RunConfig
from rltrain.workers.reference import ReferenceWorker


def test_reference_log_probs_in_micro_batches_equal_the_whole_shard():
    run = RunConfig()
    run.reference.micro_batch_size = 3
    worker = ReferenceWorker(run)
    params = SamplingParams(max_new_tokens=4, n=4)
    from rltrain.tasks import build_tokenizer

    tok = build_tokenizer(run.model)
    shard = sample_seeded(worker.model, tok, params, worker.device, ["1+2=", "3+4="], 0)
    rows: list[int] = []
    hook = worker.model.register_forward_pre_hook(
        lambda m, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    (got,) = worker.logprobs([shard])
    hook.remove()
    assert rows == [3, 3, 2]  # 8 rows, 3 per forward pass
    want = compute_logprobs(
        worker.model, shard.input_ids, shard.attention_mask, shard.response_mask
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
