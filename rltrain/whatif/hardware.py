"""Devices and links as records: the catalogue (``conf/whatif``) and the simulated device.

A :class:`Device` carries the published peaks the roofline needs (memory, memory bandwidth,
dense BF16 FLOP/s) and the names of its links; a :class:`Link` a bandwidth each way and a
latency. ``SIM`` stands for rltrain's simulated devices: their device time is the ``simulate.*``
latencies, and their compute is the host's CPU (rough peaks, refined by calibration).
"""

from __future__ import annotations

from dataclasses import dataclass

from rltrain.config.catalogue import entries
from rltrain.errors import ConfigError

GB = 1e9


@dataclass(frozen=True)
class Link:
    """A link: ``bandwidth_gbs`` (GB/s each way, per device) and ``latency_us``."""

    name: str
    bandwidth_gbs: float
    latency_us: float = 0.0
    source: str = ""

    def seconds(self, nbytes: float, hops: int = 1) -> float:
        """Seconds to move ``nbytes`` over the link (``hops`` latencies)."""
        return hops * self.latency_us * 1e-6 + nbytes / (self.bandwidth_gbs * GB)


@dataclass(frozen=True)
class Device:
    """An accelerator's published peaks.

    Attributes:
        name: the catalogue name.
        memory_gib: device memory.
        memory_bandwidth_gbs: memory bandwidth, GB/s.
        bf16_tflops: dense BF16 peak, TFLOP/s.
        intra: the link between the devices of a node.
        host: the link to host memory (offload, reload, host weight sync).
        simulated: rltrain's simulated device (``simulate.*`` latencies are its device time).
        source: where the figures come from.
    """

    name: str
    memory_gib: float
    memory_bandwidth_gbs: float
    bf16_tflops: float
    intra: Link
    host: Link
    simulated: bool = False
    source: str = ""

    @property
    def flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def bandwidth(self) -> float:
        return self.memory_bandwidth_gbs * GB


def link(name: str) -> Link:
    """The catalogue's link ``name``.

    Raises:
        ConfigError: for a name the catalogue lacks (the known ones listed).
    """
    known = entries("links")
    e = known.get(str(name).lower())
    if e is None:
        raise ConfigError(f"link {name!r} is not in the catalogue: choose one of {sorted(known)}")
    return Link(e["name"], float(e["bandwidth_gbs"]), float(e.get("latency_us", 0)), e["source"])


def device(name: str) -> Device:
    """The catalogue's device ``name``.

    Raises:
        ConfigError: for a name the catalogue lacks (the known ones listed).
    """
    known = entries("devices")
    e = known.get(str(name).lower())
    if e is None:
        raise ConfigError(
            f"whatif.hardware={name!r} is not in the catalogue: choose one of {sorted(known)}"
        )
    return Device(
        name=e["name"],
        memory_gib=float(e["memory_gib"]),
        memory_bandwidth_gbs=float(e["memory_bandwidth_gbs"]),
        bf16_tflops=float(e["bf16_tflops"]),
        intra=link(e["intra_node_link"]),
        host=link(e["host_link"]),
        source=e["source"],
    )


#: Host memory as the simulated devices' links: Ray's object store and shared memory move
#: ~5-7 GB/s on the development VM (docs/runtime.md), gloo ~3 GB/s.
HOST_MEMORY = Link("host-memory", 5.0, 50.0, "measured: ENVIRONMENT.md (object store put/get)")
#: rltrain's simulated device: a share of a small CPU (rough fp32 peaks of two cores).
SIM = Device(
    name="sim",
    memory_gib=4.0,
    memory_bandwidth_gbs=10.0,
    bf16_tflops=0.05,
    intra=HOST_MEMORY,
    host=HOST_MEMORY,
    simulated=True,
    source="rltrain's simulated devices: device time from simulate.*",
)
