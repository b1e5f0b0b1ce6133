"""GPU detection fails loudly: CUDA present but unusable is an error naming the cause, never a
silent fall-back to simulated devices; ``simulate.*`` latencies are refused on real devices.

Detection is made to fail in a controlled way by replacing the NVML probe (no Ray is started).
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from rltrain.config import engine_checks, load_config
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, ResourceError
from rltrain.placement.plan import build_plan
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec
from rltrain.scheduler import cluster
from rltrain.workers.common import compute_device


@pytest.fixture
def driver_lists_two_gpus(tmp_path, monkeypatch):
    """The NVIDIA driver's device list shows two GPUs (two entries, as /proc has)."""
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / bus).mkdir()
    monkeypatch.setattr(engine_checks, "DRIVER_GPU_DIR", str(tmp_path), raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _nvml_fails(monkeypatch, message: str = "Driver/library version mismatch") -> None:
    def broken(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(cluster, "nvml_gpu_count", broken, raising=False)
    # Ray's own probe, which the detection used before, fails the same way.
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    monkeypatch.setattr(
        NvidiaGPUAcceleratorManager, "get_current_node_num_accelerators", staticmethod(broken)
    )


def test_gpus_listed_by_the_driver_but_unusable_are_an_error_naming_the_cause(
    driver_lists_two_gpus, monkeypatch
):
    _nvml_fails(monkeypatch)
    with pytest.raises(ResourceError, match="lists 2 GPU.*Driver/library version mismatch"):
        cluster.local_gpu_count()


def test_gpus_listed_by_the_driver_but_counted_zero_are_an_error(
    driver_lists_two_gpus, monkeypatch
):
    monkeypatch.setattr(cluster, "nvml_gpu_count", lambda: 0)
    with pytest.raises(ResourceError, match="NVML counts none"):
        cluster.local_gpu_count()


def test_a_machine_without_the_driver_has_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_checks, "DRIVER_GPU_DIR", str(tmp_path / "absent"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _nvml_fails(monkeypatch, "NVML Shared Library Not Found")
    assert cluster.local_gpu_count() == 0


def test_visible_devices_limit_and_hide(driver_lists_two_gpus, monkeypatch):
    monkeypatch.setattr(cluster, "nvml_gpu_count", lambda: 2)
    assert cluster.local_gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert cluster.local_gpu_count() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    _nvml_fails(monkeypatch)  # hidden GPUs are not probed at all
    assert cluster.local_gpu_count() == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that cannot use CUDA")
def test_a_worker_placed_on_cuda_devices_without_cuda_in_torch_is_an_error(monkeypatch):
    worker = types.SimpleNamespace(devices=(0,), rank=1)
    monkeypatch.setenv("RLTRAIN_ACCELERATOR", "cuda")
    with pytest.raises(ResourceError, match=r"rank 1 was placed on CUDA device\(s\) \[0\].*Torch"):
        compute_device(worker)
    monkeypatch.setenv("RLTRAIN_ACCELERATOR", "sim")  # simulated devices compute on the CPU
    assert compute_device(worker) == torch.device("cpu")
    with pytest.raises(ResourceError, match="torch cannot use CUDA there"):
        cluster.cuda_device_memory()


def _latency_run() -> RunConfig:
    run = RunConfig()
    run.simulate.rollout_latency_ms = 600.0
    run.placement.component_placement = {"actor,rollout": "all", "reward": "0"}
    return run


def test_simulated_latency_is_refused_before_ray_on_a_local_gpu_machine(monkeypatch):
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: True)
    with pytest.raises(ConfigError, match=r"simulate.rollout_latency_ms=600.*real.*=0"):
        load_config(_latency_run())
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: False)
    assert load_config(_latency_run()).simulate.rollout_latency_ms == 600.0  # simulated: fine


def test_simulated_latency_is_refused_once_ray_reports_real_gpus():
    from rltrain.runners.job import refuse_simulated_latency

    run = _latency_run()
    node = NodeSpec(0, 2, 80 * GIB, accelerator_type="cuda")
    plan = build_plan(run, ClusterSpec(nodes=(node,)), check_fit=False)
    with pytest.raises(ConfigError, match="2 CUDA GPU"):
        refuse_simulated_latency(run, plan)
    sim = dataclasses.replace(node, accelerator_type="sim")
    refuse_simulated_latency(run, build_plan(run, ClusterSpec(nodes=(sim,)), check_fit=False))


def test_a_gpu_node_probed_once_is_not_probed_again(monkeypatch):
    # a driver discovers its cluster twice (the attempt's Ray, then the job joining it); each
    # probe is a worker process on the node: known nodes are answered from what was measured
    monkeypatch.setattr(cluster, "_GPU_MEMORY", {"node-a": 80 * GIB})
    entries = [
        {"NodeID": "node-a", "Alive": True, "Resources": {"accelerator_type:H100": 1.0}},
        {"NodeID": "node-c", "Alive": True, "Resources": {"CPU": 8.0}},  # no GPU: not probed
    ]
    assert cluster._measure_gpu_memory(entries) == {"node-a": 80 * GIB}  # no Ray is running
