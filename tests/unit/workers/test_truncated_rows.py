"""``RolloutBatch.truncated`` (rows the token budget cut) from both torch generation paths
through everything that carries a batch: the wire, shard joining, row selection, padding trims,
and into the step's counts."""

from __future__ import annotations

import pickle

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import trim_padding
from rltrain.backends.generation import TorchGeneration, sample_seeded, sampling_seed
from rltrain.config.schema import RunConfig
from rltrain.workers.batching import concat_batches, with_scores
from rltrain.workers.reward import RuleReward, batch_counts

PAD = 0


def _shard(resp: list[list[int]], truncated: list[bool] | None) -> RolloutBatch:
    ids = torch.tensor(resp)
    return RolloutBatch(
        prompt_ids=torch.ones(len(resp), 2, dtype=torch.long),
        prompt_mask=torch.ones(len(resp), 2, dtype=torch.long),
        response_ids=ids,
        response_mask=(ids != PAD).float(),
        truncated=None if truncated is None else torch.tensor(truncated),
    )


def test_truncated_survives_the_wire_joining_selection_and_trims() -> None:
    a = _shard([[5, 1, PAD], [5, 5, 5]], [False, True])
    b = _shard([[5, 5, 5, 5, 5]], [True])
    joined = concat_batches([pickle.loads(pickle.dumps(a)), b], PAD)
    assert joined.truncated.dtype == torch.bool
    assert joined.truncated.tolist() == [False, True, True]
    scored = with_scores([joined], [torch.tensor([1.0, 0.0, 0.5])])[0]
    assert scored.truncated.tolist() == [False, True, True]
    picked = scored.select(torch.tensor([2, 0])).to("cpu")
    assert picked.truncated.tolist() == [True, False]
    assert trim_padding(picked.select(torch.tensor([1]))).truncated.tolist() == [False]
    # a shard that does not say leaves the joined batch without the flag (not all-False)
    assert concat_batches([a, _shard([[5, 5, 5]], None)], PAD).truncated is None


def test_torch_rollout_and_fused_sampling_flag_the_rows_the_budget_cut() -> None:
    run = RunConfig()
    run.model.num_layers = 1
    run.rollout.max_new_tokens = 2  # an untrained model rarely samples its EOS in 2 tokens
    run.rollout.n_samples_per_prompt = 8
    engine = TorchGeneration(run, torch.device("cpu"))
    batch = engine.generate(["1+2=", "3+4="], seed=5)
    eos = engine.tokenizer.eos_token_id
    ended = (batch.response_ids == eos) & (batch.response_mask > 0)
    assert batch.truncated.tolist() == (~ended.any(dim=1)).tolist()
    assert batch.truncated.any()  # the check is not vacuous
    # a fused rank samples as FusedWorker._sample does, with its rule reward's EOS ids: the
    # same rows as the rollout engine's at the same (run seed, step, rank)
    rule = RuleReward(run)
    assert rule.eos_ids == (eos,)
    same = sample_seeded(
        engine.model,
        engine.tokenizer,
        engine.params,
        torch.device("cpu"),
        ["1+2=", "3+4="],
        sampling_seed(run, 0, 0),
        rule.eos_ids,
    )
    again = engine.generate(["1+2=", "3+4="], seed=sampling_seed(run, 0, 0))
    assert torch.equal(same.truncated, again.truncated) and torch.equal(
        same.response_ids, again.response_ids
    )
    scores = rule.scores(batch)
    assert scores.counts == {"response/truncated": int(batch.truncated.sum())}
    assert batch_counts(batch) == scores.counts
    assert pickle.loads(pickle.dumps(scores)).counts == scores.counts
