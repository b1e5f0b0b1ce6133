"""What if: a step simulator that predicts a run on a cluster you have, or one you do not.

An event model of one RL step over requests and tokens (:mod:`~rltrain.whatif.events`) on a
hardware model (:mod:`~rltrain.whatif.hardware`: the ``conf/whatif`` catalogue, or rltrain's
simulated devices and their ``simulate.*`` latencies), a roofline of decoding and training
(:mod:`~rltrain.whatif.roofline`), response-length distributions
(:mod:`~rltrain.whatif.lengths`) and rltrain's own runtime terms, fitted from ``placement=auto``
profiles when there are some (:mod:`~rltrain.whatif.calibrate`). :func:`predict` returns seconds
per step and per stage, tokens/s and idle share per device, and the predicted timeline in
``trace.json``'s format; ``mode=plan`` prints it and ranks ``placement=auto``'s candidate layouts
(:mod:`~rltrain.whatif.report`). Pure Python: no Ray, no torch. See ``docs/whatif.md``.
"""

from __future__ import annotations

from rltrain.whatif.predict import Prediction, predict

__all__ = ["Prediction", "predict"]
