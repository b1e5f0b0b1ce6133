"""A process that sees several GPUs computes on its own: the current CUDA device, the devices
that host loads synchronize, and vLLM's refusal where it would pick GPU 0 anyway."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from composed import composed_run as load

from rltrain.backends.weight_sync import host
from rltrain.config import engine_checks
from rltrain.errors import ConfigError
from rltrain.workers import common


def test_cuda_device_to_select_is_the_first_own_position():
    assert common.cuda_device_to_select((2,)) == 2
    assert common.cuda_device_to_select((3, 1)) == 3
    assert common.cuda_device_to_select((0,)) is None  # already current: CUDA stays untouched
    assert common.cuda_device_to_select(()) is None


def test_compute_device_makes_its_gpu_current(monkeypatch):
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    worker = SimpleNamespace(devices=(2,), rank=0)
    assert common.compute_device(worker) == torch.device("cuda", 2)
    assert chosen == [2]  # NCCL groups and bare synchronize() calls now go to cuda:2
    assert common.compute_device(SimpleNamespace(devices=(0,), rank=0)).index == 0
    assert chosen == [2]


def test_host_load_synchronizes_the_targets_device(monkeypatch):
    synced: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    packed = host.pack_to_host([("w", torch.ones(3))])
    target = torch.zeros(3)
    on_gpu = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 3))
    assert host.load_from_host(packed, {"w": target, "other": on_gpu}) == 1
    assert torch.equal(target, torch.ones(3))
    assert synced == [torch.device("cuda", 3)]


def test_vllm_is_refused_without_isolated_accelerators(monkeypatch):
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: True)
    monkeypatch.setattr(engine_checks, "package_installed", lambda name: True)
    with pytest.raises(ConfigError) as info:
        load("rollout.backend=vllm", "placement.isolate_accelerator=false")
    text = str(info.value)
    assert "placement.isolate_accelerator=false with rollout.backend='vllm'" in text
    assert "set placement.isolate_accelerator=true" in text
    assert load("rollout.backend=vllm").placement.isolate_accelerator
    assert not load("placement.isolate_accelerator=false").placement.isolate_accelerator
