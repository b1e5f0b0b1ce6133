"""Every module of the layers below the tasks imports as the first rltrain module of a process:
a cycle through a package's ``__init__`` (``rltrain.kinds.components`` -> ``rltrain.config`` ->
its checks -> ``rltrain.kinds.registry`` -> ``rltrain.kinds.components``, half made) passes the
layer test, which sees modules, and breaks only a process that starts there."""

from __future__ import annotations

import subprocess
import sys

from test_torch_free_layers import TORCH_FREE

#: One process; before each module every rltrain module is dropped from ``sys.modules``, so the
#: module is imported as the first (the libraries it pulls stay loaded: only rltrain's order
#: matters).
PROBE = """
import importlib, pkgutil, sys
names = []
for top in sys.argv[1:]:
    pkg = importlib.import_module(top)
    names.append(top)
    names += [i.name for i in pkgutil.walk_packages(getattr(pkg, "__path__", []), top + ".")]
failed = []
for name in names:
    for key in [k for k in sys.modules if k == "rltrain" or k.startswith("rltrain.")]:
        del sys.modules[key]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {exc!r}")
print(len(names))
print("\\n".join(failed))
"""


def test_each_lower_layer_module_imports_first():
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *TORCH_FREE], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    count, *failed = out.stdout.strip().splitlines()
    assert int(count) > 50  # the walk found the layers' modules
    assert failed == []
