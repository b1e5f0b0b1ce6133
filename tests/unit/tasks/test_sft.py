"""Supervised fine-tuning: the batch layout and the loss, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rltrain.tasks.sft import IGNORE, sft_batch, sft_loss, supervised_finetune


def test_batch_is_right_padded_with_only_the_responses_labelled():
    ids, mask, labels = sft_batch([([5, 6], [7, 8, 9]), ([4], [3])], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9], [4, 3, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert labels.tolist() == [
        [IGNORE, IGNORE, 7, 8, 9],
        [IGNORE, 3, IGNORE, IGNORE, IGNORE],
    ]
    with pytest.raises(ValueError, match="pair 0 has an empty response"):
        sft_batch([([1], [])], 0)


class Table(torch.nn.Module):
    """A 'model' whose next-token logits are a fixed row per input token."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(logits.clone())

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_loss_is_the_mean_over_response_tokens_only():
    # vocab 3; after token 0 the model puts p(1) = 1/2, p(2) = 1/4 (log-probs -ln2, -2 ln2)
    table = torch.log(torch.tensor([[0.25, 0.5, 0.25], [0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]]))
    model = Table(table)
    # prompt [0], response [1, 2]: terms -log p(1|0) = ln 2 and -log p(2|1) = ln 2
    # prompt [0, 0], response [2] (then padding 0): one term -log p(2|0) = 2 ln 2
    ids, mask, labels = sft_batch([([0], [1, 2]), ([0, 0], [2])], pad_token_id=0)
    loss = sft_loss(model, ids, mask, labels)
    assert float(loss) == pytest.approx((math.log(2) + math.log(2) + 2 * math.log(2)) / 3)


def test_finetuning_learns_a_mapping_and_leaves_eval_mode():
    torch.manual_seed(0)
    model = Table(torch.zeros(4, 4))
    pairs = [([0], [1]), ([2], [3])]
    losses = supervised_finetune(model, pairs, 0, steps=50, batch_size=2, lr=0.1, seed=1)
    assert len(losses) == 50 and losses[-1] < 0.1 * losses[0]
    assert not model.training
    assert supervised_finetune(model, pairs, 0, steps=0, batch_size=2, lr=0.1) == []
    with pytest.raises(ValueError, match="batch_size=0"):
        supervised_finetune(model, pairs, 0, steps=1, batch_size=0, lr=0.1)


def test_tokens_not_trained_on_get_no_gradient():
    """A demonstration's tool result is read but not learned: the row of the token before it
    (which would predict it) is left as it was; the rest learns."""
    model = Table(torch.zeros(4, 4))
    # prompt [0], response [1, 2, 3]: 2 is the tool's result (predicted from 1), 3 is learned
    pairs = [([0], [1, 2, 3])]
    supervised_finetune(
        model, pairs, 0, steps=5, batch_size=1, lr=0.1, trained=[[True, False, True]]
    )
    table = model.table.detach()
    assert torch.equal(table[1], torch.zeros(4))  # predicts the masked token: untouched
    assert table[0].argmax() == 1 and table[2].argmax() == 3  # the trained tokens: learned
    with pytest.raises(ValueError, match="one flag per response token"):
        supervised_finetune(model, pairs, 0, steps=1, batch_size=1, lr=0.1, trained=[[True]])
