"""`cluster.device_memory_gib`: simulated capacity, or the GPUs' own memory before Ray starts.

On a GPU machine a run with `cluster.simulate_devices=false` and the key left null planned on
4 GiB devices and refused a 0.5B model that fits an H200 many times over (the 2026-11-26 lease).
"""

from __future__ import annotations

import os
import stat

import pytest

from rltrain.config import engine_checks
from rltrain.errors import ConfigError
from rltrain.placement.types import GIB, ClusterSpec


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """An `nvidia-smi` on PATH printing the given MiB per GPU; the process cache cleared."""

    def install(*mib: int) -> None:
        tool = tmp_path / "nvidia-smi"
        lines = "\\n".join(str(m) for m in mib)
        tool.write_text(f'#!/bin/sh\ncase "$*" in *memory.total*) printf "{lines}\\n";; esac\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    monkeypatch.setattr(engine_checks, "_LOCAL_GPU_MEMORY", [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


def spec(**cluster):
    return ClusterSpec.from_config({"num_nodes": 1, "devices_per_node": 1, **cluster})


def test_simulated_devices_default_to_4_gib_or_take_the_value():
    assert spec().nodes[0].device_memory_bytes == 4 * GIB
    assert spec(device_memory_gib=None).nodes[0].device_memory_bytes == 4 * GIB
    assert spec(device_memory_gib=1.5).nodes[0].device_memory_bytes == int(1.5 * GIB)


def test_gpus_left_null_plan_on_the_smallest_local_gpu(fake_smi):
    fake_smi(143771, 81559)
    node = spec(simulate_devices=False).nodes[0]
    assert node.accelerator_type == "cuda"
    assert node.device_memory_bytes == 81559 * 2**20


def test_a_configured_value_is_what_gpus_plan_on(fake_smi):
    fake_smi(143771)
    assert spec(simulate_devices=False, device_memory_gib=40).nodes[0].device_memory_bytes == (
        40 * GIB
    )


def test_gpus_left_null_without_a_gpu_to_read_are_refused_naming_the_key(monkeypatch, tmp_path):
    monkeypatch.setattr(engine_checks, "_LOCAL_GPU_MEMORY", [])
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    with pytest.raises(ConfigError, match=r"cluster.device_memory_gib=null with .*\(e\.g\. 80\)"):
        spec(simulate_devices=False)
    # CPU-only nodes need no device memory
    assert spec(simulate_devices=False, devices_per_node=0).nodes[0].accelerator_type == "none"


def test_a_hidden_gpu_list_reads_as_no_gpu(fake_smi, monkeypatch):
    fake_smi(81559)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert engine_checks.local_gpu_memory_bytes() is None


def test_the_plan_of_a_0_5b_model_fits_the_read_gpu(fake_smi):
    """The lease's run: Qwen2.5-0.5B collocated on one GPU, planned before Ray."""
    from omegaconf import OmegaConf
    from placement_helpers import CONF, compose

    from rltrain.config import load_config
    from rltrain.placement.plan import build_plan

    fake_smi(143771)
    base = OmegaConf.structured(
        compose(
            "collocated",
            **{
                "cluster.simulate_devices": "false",
                "cluster.devices_per_node": 1,
                "actor.micro_batch_size": 4,
                "rollout.max_new_tokens": 256,
            },
        )
    )
    run = load_config(
        OmegaConf.merge(base, {"model": OmegaConf.load(CONF / "model/qwen2_0_5b.yaml")})
    )
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))  # refused at 4 GiB
    assert plan.cluster.nodes[0].device_memory_bytes == 143771 * 2**20


def test_a_chosen_micro_batch_leaves_the_allocator_room_on_gpus(fake_smi):
    """The lease's fused run: micro-batch 128 planned 125 GiB of an H200's 139.8 and ran out;
    on GPUs the chooser keeps within 85 % (64 rows: 67.5 GiB, the plain loop's 62 measured)."""
    from omegaconf import OmegaConf
    from placement_helpers import CONF, compose

    from rltrain.config import load_config
    from rltrain.placement.micro_batches import CUDA_HEADROOM, choose_micro_batches
    from rltrain.placement.plan import build_plan

    def lease_run(simulated: bool) -> object:
        base = OmegaConf.structured(
            compose(
                "collocated",
                **{
                    "cluster.simulate_devices": str(simulated).lower(),
                    "cluster.devices_per_node": 1,
                    "cluster.device_memory_gib": 139.8,
                    "rollout.max_new_tokens": 256,
                    "task.max_prompt_length": 8,
                },
            )
        )
        model = {"model": OmegaConf.load(CONF / "model/qwen2_0_5b.yaml")}
        return load_config(OmegaConf.merge(base, model))

    fake_smi(143771)
    chosen = {}
    for simulated in (True, False):
        run, _ = choose_micro_batches(lease_run(simulated))
        chosen[simulated] = run.actor.micro_batch_size
        plan = build_plan(run, ClusterSpec.from_config(run.cluster))
        (memory,) = plan.memory.values()
        share = memory.peak_bytes / memory.capacity_bytes
        assert share <= (1.0 if simulated else CUDA_HEADROOM)
    assert chosen == {True: 128, False: 64}
