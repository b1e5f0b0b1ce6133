"""The runners' imports, which the driver runs in a second thread while Ray starts
(``Cluster.start(meanwhile=...)``), import none of Ray's modules: a module two threads import at
once can be handed half-initialised to one of them."""

from __future__ import annotations

import json
import subprocess
import sys

from rltrain.kinds import registry

PROBE = """
import importlib, json, sys
import ray
from rltrain.scheduler.cluster import Cluster  # imported before the thread starts (app.py)
before = set(sys.modules)
for entry in json.loads(sys.argv[1]):
    importlib.import_module(entry.partition(":")[0])
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.split(".")[0] == "ray")))
"""


def test_the_runner_modules_import_no_ray_module_that_ray_init_may_import():
    entries = sorted({registry.runner(name).entry for name in registry.runner_names()})
    assert len(entries) >= 2  # reasoning and embodied
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(entries)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
