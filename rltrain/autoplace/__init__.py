"""``placement=auto``: rltrain chooses the placement.

1. **Profile** (:mod:`~rltrain.autoplace.profile`): short real runs of a few layouts on the
   cluster's devices, read back from what runs record (``metrics.jsonl``, ``trace.json``) and
   fitted (:mod:`~rltrain.autoplace.fit`); cached by model, task and cluster.
2. **Enumerate** (:mod:`~rltrain.autoplace.candidates`): collocated (fused or taking turns),
   disaggregated splits and hybrid layouts, with and without ``trainer.max_staleness=1`` where
   allowed, and pipeline stage counts for embodied runs; linear in the devices.
3. **Predict and rank** (:mod:`~rltrain.autoplace.cost`, :mod:`~rltrain.autoplace.search`): the
   documented cost model; candidates the config's checks, the plan's memory model or
   preflight refuse (as they would the same layout set by hand) are excluded with the reason.
4. **Choose** (:func:`choose`): the winner's run config, the ranking and its table.

The pure parts (settings, candidates, cost, fit, readings, search's ranking) import neither Ray
nor torch. See ``docs/auto_placement.md``.
"""

from __future__ import annotations

from rltrain.autoplace.choose import AutoChoice, choose
from rltrain.autoplace.settings import AutoSettings, check_auto

__all__ = ["AutoChoice", "AutoSettings", "check_auto", "choose"]
