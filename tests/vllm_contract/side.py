"""Where vLLM 0.26.0's own code lives for these tests, and putting it on ``sys.path``.

``bash tools/vllm_contract/install.sh`` unpacks vLLM's Python code and the small packages its
engine boundary imports into ``.vllm_contract/`` (or ``$RLTRAIN_VLLM_CONTRACT_DIR``). They go
*after* the project's own packages on ``sys.path``, so torch, transformers and pydantic stay the
project's. The files of this directory are named ``contract_*.py`` so that the main test run does
not import vLLM into its own process: ``tests/unit/backends/test_vllm_contract.py`` runs them in a
pytest of their own (``python -m pytest tests/vllm_contract -o python_files='contract_*.py'``).
"""

from __future__ import annotations

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.26.0"


def side_dir() -> pathlib.Path:
    """The side directory the install script fills."""
    return pathlib.Path(os.environ.get("RLTRAIN_VLLM_CONTRACT_DIR") or ROOT / ".vllm_contract")


def installed() -> bool:
    """Whether the install script completed there."""
    return (side_dir() / "STAMP").is_file()


def use_vllm() -> None:
    """Make ``import vllm`` find vLLM 0.26.0's code.

    Raises:
        RuntimeError: the side directory is missing (run the install script).
    """
    if not installed():
        raise RuntimeError(
            f"vLLM {VLLM_VERSION}'s code is not in {side_dir()}: run "
            f"bash tools/vllm_contract/install.sh"
        )
    for sub in ("site", "deps"):
        path = str(side_dir() / sub)
        if path not in sys.path:
            sys.path.append(path)
