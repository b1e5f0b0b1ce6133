"""rltrain against vLLM 0.26.0's own code (tests/vllm_contract/), run in a pytest of its own so
that vLLM is never imported into this test process (it sets environment variables and registers
torch ops on import).

CI (``.ci/run``) installs vLLM's code beside the project first and sets
``RLTRAIN_REQUIRE_VLLM_CONTRACT=1``: there a missing install fails this test. Elsewhere it is
skipped, saying how to install it.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
CONTRACT = ROOT / "tests" / "vllm_contract"
sys.path.insert(0, str(CONTRACT))
from side import VLLM_VERSION, installed, side_dir  # noqa: E402

sys.path.remove(str(CONTRACT))

#: Every module of the contract suite, so a renamed file cannot drop out unnoticed.
MODULES = ("contract_engine", "contract_outputs", "contract_rpc", "contract_sampling")


def test_vllms_own_code_accepts_what_rltrain_sends_and_returns_what_it_reads() -> None:
    if not installed():
        why = (
            f"vLLM {VLLM_VERSION}'s code is not in {side_dir()}: run "
            f"`bash tools/vllm_contract/install.sh` (CI does)"
        )
        if os.environ.get("RLTRAIN_REQUIRE_VLLM_CONTRACT"):
            pytest.fail(why)
        pytest.skip(why)
    assert sorted(p.stem for p in CONTRACT.glob("contract_*.py")) == sorted(MODULES)
    env = {**os.environ, "RLTRAIN_REQUIRE_VLLM_CONTRACT": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra",
         "-o", "python_files=contract_*.py", str(CONTRACT)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    report = proc.stdout[-8000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 16, report
    assert not re.search(r"skipped|xfail|deselected", summary), report
