"""Hydra entry point: ``python -m rltrain [overrides]`` and the console script ``rltrain``.

Two sub-commands are dispatched before Hydra sees the command line: ``rltrain bench [name ...]``
(the benchmark CLI, :mod:`rltrain.bench`) and ``rltrain trace <run dir>`` (the timeline picture,
:mod:`rltrain.trace`). A bare word is never a Hydra override (those hold ``=`` or start with
``-``, ``+`` or ``~``), so the sub-command names cannot shadow one.

Configs come from the source tree's ``conf/`` when run from a checkout, and from the installed
package ``rltrain.conf`` otherwise (the wheel ships ``conf/`` under that name).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

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


#: Sub-command name -> the module whose ``main(argv, prog=...)`` runs it.
SUBCOMMANDS = {"bench": "rltrain.bench.__main__", "trace": "rltrain.trace"}


def subcommand(argv: Sequence[str]) -> Callable[[], int] | None:
    """The sub-command ``argv`` asks for, ready to run, or None for a Hydra command line.

    Args:
        argv: the arguments after the program name.

    Returns:
        A call that runs the sub-command on the remaining arguments and returns its exit code;
        None when ``argv`` does not start with a sub-command name.
    """
    if not argv or argv[0] not in SUBCOMMANDS:
        return None
    name, rest = argv[0], list(argv[1:])
    launcher = "python -m rltrain" if os.path.basename(sys.argv[0]) == "__main__.py" else "rltrain"
    prog = f"{launcher} {name}"

    def run() -> int:
        module = importlib.import_module(SUBCOMMANDS[name])
        return module.main(rest, prog=prog)

    return run


def main() -> None:
    """Console-script entry: a sub-command, else Hydra, with configuration mistakes made short.

    Hydra prints its own errors and exits 1; asking it to re-raise lets us print one message that
    names the key, the value and the fix, and exit 2. Set HYDRA_FULL_ERROR=1 for tracebacks.
    """
    command = subcommand(sys.argv[1:])
    if command is not None:
        sys.exit(command())
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
