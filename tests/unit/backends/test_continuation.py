"""Partial rollouts that continue: stitching a paused generation's rows (hand-made tensors)."""

from __future__ import annotations

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.backends.continuation import (
    continuation_prompts,
    finished,
    park,
    stitch,
)
from rltrain.backends.generation import continuation_token_ids

T = torch.tensor
PAD = 0


def _paused() -> RolloutBatch:
    """Three rows paused after 2 decoding steps; row 1 ended on EOS (9) at its first token."""
    return RolloutBatch(
        prompt_ids=T([[PAD, 5], [PAD, 5], [6, 7]]),
        prompt_mask=T([[0, 1], [0, 1], [1, 1]]),
        response_ids=T([[11, 12], [9, PAD], [21, 22]]),
        response_mask=T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]),
        group_size=1,
        old_logprobs=T([[-0.1, -0.2], [-0.3, 0.0], [-0.4, -0.5]]),
        truncated=T([True, False, True]),
    )


def test_the_rows_still_decoding_go_back_as_longer_prompts():
    parked = park(_paused(), version=3, started=3)
    assert parked.live_rows().tolist() == [0, 2] and parked.columns == 2
    ids, mask = continuation_prompts(parked)
    assert ids.tolist() == [[PAD, 5, 11, 12], [6, 7, 21, 22]]
    assert mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    # vLLM takes them unpadded
    assert continuation_token_ids(ids, mask) == [[5, 11, 12], [6, 7, 21, 22]]


def test_stitch_appends_the_continuation_and_records_each_tokens_version():
    parked = park(_paused(), version=3, started=3)
    # rows 0 and 2 continued with version 4: row 0 ends on EOS after one token, row 2 is cut
    more = RolloutBatch(
        prompt_ids=T([[PAD, 5, 11, 12], [6, 7, 21, 22]]),
        prompt_mask=T([[0, 1, 1, 1], [1, 1, 1, 1]]),
        response_ids=T([[9, PAD], [23, 24]]),
        response_mask=T([[1.0, 0.0], [1.0, 1.0]]),
        old_logprobs=T([[-0.6, 0.0], [-0.7, -0.8]]),
        truncated=T([False, True]),
    )
    out = finished(stitch(parked, more, version=4, pad_token_id=PAD))
    assert out.prompt_ids.tolist() == _paused().prompt_ids.tolist()  # prompts unchanged
    assert out.response_ids.tolist() == [[11, 12, 9, PAD], [9, PAD, PAD, PAD], [21, 22, 23, 24]]
    assert out.response_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert out.token_versions.tolist() == [[3, 3, 4, -1], [3, -1, -1, -1], [3, 3, 4, 4]]
    want = T([[-0.1, -0.2, -0.6, 0.0], [-0.3, 0.0, 0.0, 0.0], [-0.4, -0.5, -0.7, -0.8]])
    assert torch.equal(out.old_logprobs, want)
    assert out.truncated.tolist() == [False, False, True]


def test_a_second_pause_keeps_the_started_version_and_stitches_again():
    parked = park(_paused(), version=3, started=3)
    first = RolloutBatch(  # one more token each for rows 0 and 2 with version 4, still decoding
        prompt_ids=T([[0], [0]]),
        prompt_mask=T([[1], [1]]),
        response_ids=T([[13], [23]]),
        response_mask=T([[1.0], [1.0]]),
        truncated=T([True, True]),
    )
    again = stitch(parked, first, version=4, pad_token_id=PAD)
    assert again.started == 3 and again.live_rows().tolist() == [0, 2]
    second = RolloutBatch(
        prompt_ids=T([[0], [0]]),
        prompt_mask=T([[1], [1]]),
        response_ids=T([[9], [9]]),
        response_mask=T([[1.0], [1.0]]),
        truncated=T([False, False]),
    )
    out = finished(stitch(again, second, version=5, pad_token_id=PAD))
    assert out.token_versions.tolist() == [[3, 3, 4, 5], [3, -1, -1, -1], [3, 3, 4, 5]]
    assert out.old_logprobs is None  # the continuation recorded none: nothing half-filled
    assert not out.truncated.any()
