"""choose_transport: the weight-sync transport a plan allows, with hand-checked layouts."""

from __future__ import annotations

import pytest
from composed import composed_run as compose_run

from rltrain.errors import ConfigError
from rltrain.placement.plan import build_plan
from rltrain.placement.transport_choice import choose_transport
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec


def plan_of(run, devices: int, accel: str):
    nodes = (NodeSpec(0, devices, 80 * GIB, accel),)
    return build_plan(run, ClusterSpec(nodes))


def test_auto_on_simulated_devices_keeps_the_object_store():
    run = compose_run("placement=disaggregated")
    choice = choose_transport(run, plan_of(run, 2, "sim"))
    assert choice.name == "host" and choice.backend is None
    assert "auto" in choice.reason and "simulated" in choice.reason
    assert choice.sources == (0,) and choice.feeder_ranks(0) == (0,)


def test_collective_on_cpu_is_gloo_from_each_replica_source():
    # actor on devices 0-1 (two replicas), rollout on 2-3: rollout rank r is fed by replica r % 2
    run = compose_run(
        "placement=disaggregated",
        "placement.component_placement.actor=0-1",
        "placement.component_placement.rollout=2-3",
        "weight_sync.transport=collective",
    )
    choice = choose_transport(run, plan_of(run, 4, "sim"))
    assert (choice.name, choice.backend) == ("collective", "gloo")
    assert choice.sources == (0, 1)
    assert choice.receivers_of(0) == (0,) and choice.receivers_of(1) == (1,)
    assert choice.to_dict()["groups"] == {"0": [0], "1": [1]}


def test_collective_may_share_simulated_devices_but_not_gpus():
    run = compose_run("placement=collocated", "weight_sync.transport=collective")
    sim = choose_transport(run, plan_of(run, 2, "sim"))
    assert (sim.name, sim.backend) == ("collective", "gloo")
    # the collocated rollout rank r is fed by the actor rank on its own device
    assert sim.receivers_of(0) == (0,) and sim.receivers_of(1) == (1,)
    with pytest.raises(ConfigError, match="weight_sync.transport=collective.*NCCL.*share"):
        choose_transport(run, plan_of(run, 2, "cuda"))


def test_auto_on_gpus_picks_ipc_collocated_and_nccl_disaggregated():
    collocated = compose_run("placement=collocated")
    ipc = choose_transport(collocated, plan_of(collocated, 2, "cuda"))
    assert ipc.name == "ipc" and ipc.feeder_ranks(1) == (1,)
    disagg = compose_run("placement=disaggregated")
    nccl = choose_transport(disagg, plan_of(disagg, 2, "cuda"))
    assert (nccl.name, nccl.backend) == ("collective", "nccl")
    assert nccl.receivers_of(0) == (0,)


def test_auto_falls_back_to_host_on_a_partial_gpu_overlap():
    # rollout on devices 1-2 (one process spanning both, TP needs vLLM; here two TP=1 ranks),
    # actor on 0-1: rollout rank 0 shares device 1 with actor rank 1 but device 2 has no actor
    run = compose_run(
        "placement=disaggregated",
        "placement.mode=null",
        "placement.component_placement.actor=0-1",
        "placement.component_placement.rollout=1-2",
    )
    plan = plan_of(run, 3, "cuda")
    choice = choose_transport(run, plan)
    assert choice.name == "host" and "overlap only partly" in choice.reason


def test_explicit_ipc_is_refused_off_cuda_and_when_not_collocated():
    run = compose_run("placement=collocated", "weight_sync.transport=ipc")
    with pytest.raises(ConfigError, match="weight_sync.transport=ipc needs CUDA GPUs"):
        choose_transport(run, plan_of(run, 2, "sim"))
    run = compose_run("placement=disaggregated", "weight_sync.transport=ipc")
    with pytest.raises(ConfigError, match="an actor rank on every GPU"):
        choose_transport(run, plan_of(run, 2, "cuda"))


def test_explicit_host_always_serves_and_inference_gets_its_own_choice():
    run = compose_run(
        "placement=disaggregated",
        "cluster.devices_per_node=3",
        "+placement.component_placement.inference=2",
        "weight_sync.transport=host",
    )
    plan = plan_of(run, 3, "cuda")
    assert choose_transport(run, plan).name == "host"
    inference = choose_transport(run, plan, receiver="inference")
    assert inference.name == "host" and inference.receiver == "inference"
    none = choose_transport(compose_run(), plan_of(compose_run(), 2, "sim"), "inference")
    assert none.name == "none"
