"""Fixtures: the built-in tiny model and tokenizer (small, CPU, seeded)."""

from __future__ import annotations

import pytest
import torch

from rltrain.config.schema import ModelConfig
from rltrain.tasks import build_tokenizer
from rltrain.tasks.model import build_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(ModelConfig())


@pytest.fixture()
def model():
    torch.set_num_threads(1)  # the machine is shared; tiny tensors gain nothing from threads
    return build_model(ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3))
