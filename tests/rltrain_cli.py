"""The real entry point in a subprocess, as a user's shell runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def rltrain_cli(*args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rltrain ARGS`` in ``cwd`` with this process's import path, Hydra's short
    errors (``HYDRA_FULL_ERROR`` unset) and its output captured."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-m", "rltrain", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )
