"""Configuration: dataclass schemas, their registration in Hydra, and cross-field checks.

No Ray, no torch.
"""

from rltrain.config.offload import OffloadPolicy, resolve_offload
from rltrain.config.schema import COMPONENTS, RunConfig
from rltrain.config.validate import load_config

__all__ = ["COMPONENTS", "OffloadPolicy", "RunConfig", "load_config", "resolve_offload"]
