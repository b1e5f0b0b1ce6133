"""Greedy evaluation ends a response where the rollout does: at any of its EOS ids."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rltrain.algorithms import greedy_accuracy
from rltrain.config.schema import ModelConfig, TaskConfig
from rltrain.tasks import build_task, build_tokenizer


class ScriptedLM(torch.nn.Module):
    """Emits ``script[k]`` at generation step ``k`` on every row (a stand-in with known output)."""

    def __init__(self, script: list[int], vocab: int) -> None:
        super().__init__()
        self.script, self.vocab, self.calls = script, vocab, 0

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache):
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)
        logits[:, -1, self.script[min(self.calls, len(self.script) - 1)]] = 10.0
        self.calls += 1
        return SimpleNamespace(logits=logits, past_key_values=attention_mask.shape[1])


def test_greedy_accuracy_stops_on_the_rollouts_extra_eos_ids():
    tok = build_tokenizer(ModelConfig())
    seven, end_of_turn, nine = (tok.convert_tokens_to_ids(c) for c in "7=9")
    task = build_task(TaskConfig(max_operand=4), tok)
    # '=' stands in for a generation config's end-of-turn id (Qwen's <|endoftext|>)
    script = [seven, end_of_turn, nine, tok.eos_token_id]
    eos = (tok.eos_token_id, end_of_turn)
    # every response reads "7" when '=' ends it: 3+4 and 4+3 of the 25 prompts are right
    lm = ScriptedLM(script, len(tok))
    assert greedy_accuracy(lm, tok, task, max_new_tokens=4, eos_ids=eos) == pytest.approx(2 / 25)
    # with the tokenizer's EOS alone the response runs on to "7=9" and nothing is right
    assert greedy_accuracy(ScriptedLM(script, len(tok)), tok, task, max_new_tokens=4) == 0.0
