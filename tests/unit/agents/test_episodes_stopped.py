"""A multi-turn batch cancelled at a weight swap: its episodes' sampled tokens are counted as
discarded (``rollout/discarded_tokens``), since episodes are never paused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rltrain.agents.interaction import EpisodesStopped, ToolEpisodes
from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.tasks.base import Example
from rltrain.tasks.calc_tool import ALPHABET
from rltrain.tasks.model import build_model
from rltrain.tasks.tokenizer import build_char_tokenizer
from rltrain.workers.rollout import RolloutWorker


def test_a_stopped_batch_reports_the_tokens_it_sampled():
    torch.manual_seed(0)
    tok = build_char_tokenizer(ALPHABET)
    model = build_model(ModelConfig(vocab_chars=ALPHABET, hidden_size=32, intermediate_size=64))
    task = SimpleNamespace(train=[Example("1+2", "3")], eval=[])
    run = RunConfig()
    run.task.env = "rltrain.tasks.calc_tool:CalculatorEnv"
    run.rollout.n_samples_per_prompt = 4
    run.rollout.max_new_tokens = 16
    # the EOS and "]" ids never win: every turn is still decoding when the stop comes
    eos = [tok.eos_token_id]
    episodes = ToolEpisodes(run, lambda: model, tok, torch.device("cpu"), eos, task)
    episodes.call_ends = frozenset()
    episodes.eos_ids = frozenset()
    checks = iter([False, False, True])  # stop before the third decoding step
    with pytest.raises(EpisodesStopped) as stopped:
        episodes.generate(["1+2"], 5, False, lambda: next(checks))
    # step 1 joins the 4 episodes (their first token each), step 2 samples one more each
    assert stopped.value.sampled_tokens == 4 * 2
    assert stopped.value.partial is None


@pytest.mark.parametrize("policy", ["restart", "continue"])
def test_the_rollout_counts_a_stopped_batchs_tokens_as_discarded(policy):
    worker = RolloutWorker.__new__(RolloutWorker)  # only its bookkeeping, no engine
    worker._continues, worker._discarded, worker._parked = policy == "continue", {}, {}
    worker._park(3, None, None, 8)
    worker._park(3, None, None, 5)
    assert worker._discarded == {3: 13}
    assert worker._parked == {}  # nothing to continue: the resumed call samples afresh
