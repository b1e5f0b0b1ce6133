"""The vLLM backend on a machine without vLLM or a GPU: clear errors, and the sleep-level rule."""

from __future__ import annotations

import sys

import pytest
import torch

from rltrain.backends.vllm_rollout import (
    VllmRollout,
    VllmSettings,
    import_vllm,
    require_gpus,
    sleep_level_for,
)
from rltrain.config.offload import OffloadPolicy
from rltrain.errors import ConfigError, ResourceError


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import vllm` raise ImportError, installed or not.
    monkeypatch.setitem(sys.modules, "vllm", None)


def test_missing_vllm_is_a_config_error(no_vllm) -> None:
    with pytest.raises(ConfigError, match="rollout.backend=vllm needs the vllm package"):
        import_vllm()
    with pytest.raises(ConfigError, match="or set rollout.backend=torch"):
        VllmRollout(VllmSettings(model_path="/nonexistent"))


def test_bad_sleep_level_is_refused_before_importing(no_vllm) -> None:
    with pytest.raises(ConfigError, match="sleep_level=3 must be 0, 1 or 2"):
        VllmRollout(VllmSettings(model_path="/x", sleep_level=3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_no_gpu_is_a_resource_error() -> None:
    with pytest.raises(ResourceError, match="tensor_parallel_size=2 needs 2 CUDA GPU"):
        require_gpus(2)


def test_sleep_level_follows_the_policy() -> None:
    never = OffloadPolicy()
    weights = OffloadPolicy("after_stage", frozenset({"weights", "kv_cache"}))
    kv_only = OffloadPolicy("after_stage", frozenset({"kv_cache"}))
    assert sleep_level_for(never, weights_resynced_on_wake=True) == 0
    assert sleep_level_for(weights, weights_resynced_on_wake=True) == 2
    assert sleep_level_for(weights, weights_resynced_on_wake=False) == 1
    assert sleep_level_for(kv_only, weights_resynced_on_wake=True) == 1
