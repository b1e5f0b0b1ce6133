"""ARCHITECTURE.md's "imports nothing of" column: the layers below the tasks load neither torch
nor Ray, so plans, checks and traces stay importable where neither is installed."""

from __future__ import annotations

import subprocess
import sys

#: Layers 0-3.5 in ARCHITECTURE.md's order; ``rltrain.wire`` (layer 1) imports torch to pickle
#: tensors and is the one module left out.
TORCH_FREE = (
    "rltrain.errors",
    "rltrain.config",
    "rltrain.kinds",
    "rltrain.telemetry",
    "rltrain.placement",
    "rltrain.whatif",
)
TORCH_USERS = ("rltrain.wire",)

PROBE = """
import importlib, pkgutil, sys
names = []
for top in sys.argv[1:]:
    pkg = importlib.import_module(top)
    names.append(top)
    for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), top + "."):
        importlib.import_module(info.name)
        names.append(info.name)
print(len(names), sorted(m for m in ("ray", "torch") if m in sys.modules))
"""


def _loaded_after_importing(*packages: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *packages], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_layers_below_the_tasks_import_neither_torch_nor_ray():
    count, *loaded = _loaded_after_importing(*TORCH_FREE)
    assert int(count) > len(TORCH_FREE)  # the submodules were walked, not only the packages
    assert loaded == ["[]"]


def test_the_probe_sees_torch_where_a_module_imports_it():
    _, *loaded = _loaded_after_importing(*TORCH_USERS)
    assert loaded == ["['torch']"]
