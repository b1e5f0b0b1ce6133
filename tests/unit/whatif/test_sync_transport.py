"""The predicted weight sync follows the transport the run resolves (``weight_sync.transport``),
timed by hand on the catalogue's H100 (PCIe 5 host link, NVLink 4, InfiniBand)."""

from __future__ import annotations

import pytest

from rltrain.config.schema import RunConfig
from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec
from rltrain.whatif.hardware import device, link
from rltrain.whatif.predict import plan_on_hardware
from rltrain.whatif.workload import Proc, StepModel, sync_transport

W = 86_336 * 4  # the default model's parameters in float32: 345,344 bytes
H100 = device("h100")


def model(transport: str, rollout_node: int = 0) -> StepModel:
    procs = {
        "actor": (Proc("actor", 0, ("node0/dev0",), 0),),
        "rollout": (Proc("rollout", 0, (f"node{rollout_node}/dev1",), rollout_node),),
    }
    return StepModel(RunConfig(), procs, H100, link("infiniband"), transport=transport)


def test_each_transport_is_timed_over_its_own_path():
    assert model("ipc").sync() == pytest.approx(W / (3350e9 * 0.8))  # a device-local copy
    assert model("collective").sync() == pytest.approx(2e-6 + W / 450e9)  # one NVLink hop
    # GPU -> CPU and CPU -> GPU over PCIe 5 (64 GB/s, 1 us), the object store in host memory
    # (5 GB/s, 50 us)
    host = 2 * (1e-6 + W / 64e9) + 50e-6 + W / 5e9
    assert model("host").sync() == pytest.approx(host)
    # a rollout on another node also gets the buckets over InfiniBand (50 GB/s, 5 us)
    assert model("host", rollout_node=1).sync() == pytest.approx(host + 5e-6 + W / 50e9)
    assert model("none").sync() == 0.0


@pytest.mark.parametrize(
    ("layout", "transport", "resolved"),
    [
        ({"actor,rollout": "0-1"}, "auto", "ipc"),  # every rollout GPU hosts an actor rank
        ({"actor,rollout": "0-1"}, "host", "host"),
        ({"actor": "0", "rollout": "1"}, "auto", "collective"),  # NCCL on separate GPUs
        ({"actor": "0", "rollout": "1"}, "host", "host"),
    ],
)
def test_the_prediction_resolves_the_transport_as_the_run_does(layout, transport, resolved):
    run = RunConfig()
    run.cluster.devices_per_node = 2
    run.placement.component_placement = layout
    run.weight_sync.transport = transport
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    # on the simulated cluster auto takes the object store; on the H100s it would not
    assert sync_transport(run, plan) == ("host" if transport == "auto" else transport)
    assert sync_transport(run, plan_on_hardware(run, plan, H100)) == resolved
