"""``simulate.*``'s device time of a generate call: per call, plus per decoding step."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from rltrain.config.schema import SimulateConfig
from rltrain.workers.rollout import modelled_generate_s


def test_a_call_waits_its_latency_plus_the_longest_responses_tokens():
    sim = dataclasses.replace(
        SimulateConfig(), rollout_latency_ms=100.0, rollout_token_latency_ms=10.0
    )
    # three responses of 2, 5 and 3 tokens: the batch decodes 5 steps
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.float32)
    assert modelled_generate_s(sim, SimpleNamespace(response_mask=mask)) == pytest.approx(0.15)
    assert modelled_generate_s(SimulateConfig(), SimpleNamespace(response_mask=mask)) == 0.0
    per_call = dataclasses.replace(SimulateConfig(), rollout_latency_ms=100.0)
    assert modelled_generate_s(per_call, None) == pytest.approx(0.1)
