"""Helpers for the placement tests: hand-written clusters and runs composed from conf/ files.

A uniquely named module (not conftest) so test files can import it in any collection order.
"""

from __future__ import annotations

import pathlib
from typing import Any

from omegaconf import OmegaConf

from rltrain.config import load_config
from rltrain.config.schema import RunConfig
from rltrain.placement.types import GIB, ClusterSpec, NodeGroup, NodeSpec

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"


def make_cluster(
    devices: int | list[int] = 8,
    num_nodes: int = 1,
    memory_gib: float = 80.0,
    accel: str = "sim",
    groups: tuple[NodeGroup, ...] = (),
) -> ClusterSpec:
    per = devices if isinstance(devices, list) else [devices] * num_nodes
    nodes = tuple(
        NodeSpec(r, d, int(memory_gib * GIB), accel if d else "none") for r, d in enumerate(per)
    )
    return ClusterSpec(nodes, groups)


def compose(placement: str, cluster: str = "local", **overrides: Any) -> RunConfig:
    """The run Hydra would compose for ``placement=... cluster=...`` plus dotted overrides,
    built from the shipped YAML files (without starting Hydra)."""
    base = OmegaConf.load(CONF / "config.yaml")
    for key in ("defaults", "hydra"):
        base.pop(key)
    groups = {
        "cluster": f"cluster/{cluster}.yaml",
        "placement": f"placement/{placement}.yaml",
        "model": "model/tiny_llama.yaml",
        "task": "task/arithmetic.yaml",
        "algorithm": "algorithm/grpo.yaml",
    }
    cfg = OmegaConf.merge(base, {k: OmegaConf.load(CONF / v) for k, v in groups.items()})
    dots = [f"{k}={v}" for k, v in overrides.items()]
    return load_config(OmegaConf.merge(cfg, OmegaConf.from_dotlist(dots)))
