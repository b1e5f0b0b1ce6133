"""Benchmarks: ``python -m rltrain.bench [name ...] [--quick] [--out DIR]``.

Measures register by name (:func:`rltrain.bench.harness.measure`) in modules under
``rltrain.bench.measures``; each is timed after warm-up for several repeats and reported as
median and spread with a same-run baseline and the ratio to it.
"""

from rltrain.bench.harness import Case, Suite, discover, measure, run_measure

__all__ = ["Case", "Suite", "discover", "measure", "run_measure"]
