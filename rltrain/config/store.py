"""Register the schemas in Hydra's ConfigStore.

The run schema is stored as the top-level ``rltrain_schema`` (the primary config's first
default). Section schemas are stored under the group ``rltrain_schema`` so that users' own Hydra
apps can type their nodes with them; none is stored inside a selectable group such as
``placement``, so a glob sweep over ``placement`` never picks a schema.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from rltrain.config import schema

_SECTIONS = {
    "cluster": schema.ClusterConfig,
    "placement": schema.PlacementConfig,
    "model": schema.ModelConfig,
    "optimizer": schema.OptimizerConfig,
    "algorithm": schema.AlgorithmConfig,
    "task": schema.TaskConfig,
    "trainer": schema.TrainerConfig,
    "logging": schema.LoggingConfig,
}


def register_configs() -> None:
    """Store the run schema and the section schemas (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="rltrain_schema", node=schema.RunConfig)
    for name, node in _SECTIONS.items():
        cs.store(group="rltrain_schema", name=name, node=node)
