"""Every metric a runner can log is documented with its meaning and unit: the reasoning runner's
in docs/training.md, the embodied runner's in docs/embodied.md.

The keys are read from the sources that log them: the ``"section/name"`` literals, the stage
timers (``time/<stage>_s``) and the names built from constants. The embodied integration runs
check the keys a real run logged (tests/integration/embodied/test_embodied.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from rltrain.runners.stages import TOKEN_METRICS
from rltrain.workers.common import PEAK_METRICS

ROOT = Path(__file__).resolve().parents[3]
SECTIONS = "actor|critic|reward|response|rollout|batch|eval|env|loss|time|perf"
KEY = re.compile(rf'"((?:{SECTIONS})/[a-z_0-9]+)"')
#: ``timer("train")`` in a runner, ``times["train"] = ...`` in a fused rank: ``time/train_s``.
STAGE = re.compile(r'timer\("([a-z_]+)"\)|times\["([a-z_]+)"\]')
EMBODIED = (
    "rltrain/runners/embodied.py",
    "rltrain/workers/embodied.py",
    "rltrain/workers/env.py",
    "rltrain/algorithms/embodied_ppo.py",
)
#: Where the reasoning runner's metrics are made: the driver's stages, the workers, the update.
REASONING_DIRS = ("runners", "workers", "algorithms", "backends", "agents", "tasks")


def documented(doc: str) -> set[str]:
    """The ``section/name`` names a doc spells out in backticks."""
    return set(re.findall(r"`([a-z]+/[a-z_0-9]+)`", (ROOT / "docs" / doc).read_text()))


def logged_by(paths: list[Path]) -> set[str]:
    keys: set[str] = set()
    for p in paths:
        text = p.read_text()
        keys.update(KEY.findall(text))
        keys.update(f"time/{a or b}_s" for a, b in STAGE.findall(text))
    return keys


def _reasoning_sources() -> list[Path]:
    out = []
    for d in REASONING_DIRS:
        out += [p for p in sorted((ROOT / "rltrain" / d).rglob("*.py"))]
    return [p for p in out if str(p.relative_to(ROOT)) not in EMBODIED]


def test_the_key_reader_finds_literals_and_stage_timers(tmp_path):
    src = tmp_path / "x.py"
    src.write_text('out["reward/mean"] = 1\nwith timer("sync"):\ntimes["train"] = 2\n"a/b"\n')
    assert logged_by([src]) == {"reward/mean", "time/sync_s", "time/train_s"}


def test_every_reasoning_metric_is_documented_in_training_md():
    keys = logged_by(_reasoning_sources())
    keys |= set(TOKEN_METRICS) | {f"actor/{m}" for m in PEAK_METRICS}
    assert {"time/train_s", "time/sync_s", "actor/old_logprobs_s"} <= keys  # the reader works
    missing = sorted(keys - documented("training.md"))
    assert not missing, f"document these in docs/training.md's metrics table: {missing}"


def test_every_embodied_metric_is_documented_in_embodied_md():
    keys = logged_by([ROOT / p for p in EMBODIED])
    assert {"time/generate_s", "time/sync_s", "actor/lr", "loss/policy"} <= keys
    missing = sorted(keys - documented("embodied.md"))
    assert not missing, f"document these in docs/embodied.md's metrics table: {missing}"
