"""What a job does once Hydra has composed its config."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rltrain.config import load_config


def run(cfg: DictConfig) -> float | None:
    """Check the config and run the job it describes.

    Args:
        cfg: the composed Hydra config.

    Returns:
        The job's objective (for Hydra sweepers), or None.

    Raises:
        ConfigError: when the config fails a check; nothing has started yet.
    """
    run_cfg = load_config(cfg)
    if run_cfg.mode == "plan":
        from rltrain.placement.command import plan_command

        plan_command(run_cfg)
        return None
    print(OmegaConf.to_yaml(OmegaConf.structured(run_cfg)))
    return None
