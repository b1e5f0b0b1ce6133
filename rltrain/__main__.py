"""Hydra entry point: ``python -m rltrain [overrides]`` and the console script ``rltrain``.

Configs come from the source tree's ``conf/`` when run from a checkout, and from the installed
package ``rltrain.conf`` otherwise (the wheel ships ``conf/`` under that name).
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from rltrain.config.store import register_configs

_HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG_PATH = (
    "pkg://rltrain.conf"
    if os.path.isdir(os.path.join(_HERE, "conf"))
    else os.path.join(os.path.dirname(_HERE), "conf")
)

register_configs()


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def hydra_main(cfg: DictConfig) -> float | None:
    """The Hydra task function: check the config, then run the job it describes."""
    from rltrain.app import run

    return run(cfg)


def main() -> None:
    """Console-script entry: run Hydra, turning configuration mistakes into short messages.

    Hydra prints its own errors and exits 1; asking it to re-raise lets us print one message that
    names the key, the value and the fix, and exit 2. Set HYDRA_FULL_ERROR=1 for tracebacks.
    """
    from rltrain.config.errors import explain

    user_full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except Exception as exc:  # noqa: BLE001 - classified below, re-raised when not ours
        message = explain(exc)
        if message is None or user_full_error:
            raise
        print(f"rltrain: error: {message}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
