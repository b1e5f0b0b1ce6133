"""The checks of the ``whatif`` section (the what-if step simulator, :mod:`rltrain.whatif`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rltrain.config.catalogue import problems as catalogue_problems
from rltrain.config.schema import WhatifConfig

#: Response-length models the simulator knows (``whatif.response_length``).
LENGTH_MODELS = ("max", "uniform", "lognormal")
#: ``simulate.*`` keys that model device time on simulated devices: with ``whatif.hardware`` the
#: roofline models the device instead, so they would be accepted and ignored.
DEVICE_TIME_KEYS = (
    "rollout_latency_ms",
    "actor_latency_ms",
    "rollout_token_latency_ms",
    "response_length_median",
    "env_policy_latency_ms",
    "env_policy_jitter_ms",
)


def whatif_problems(cfg: Any) -> Iterator[str]:
    """Every problem of ``whatif.*``, naming the key, the value and the fix."""
    w = getattr(cfg, "whatif", None)
    if w is None:
        return
    yield from catalogue_problems(w.hardware, w.link)
    if not 2 <= w.steps <= 100_000:
        yield f"whatif.steps={w.steps} must be in [2, 100000] (the first step is a warm-up)"
    if not 0 < w.train_utilization <= 1:
        yield (
            f"whatif.train_utilization={w.train_utilization} must be in (0, 1]: the share of "
            f"the BF16 peak a training pass reaches (0.3-0.5 is typical)"
        )
    if w.response_length not in LENGTH_MODELS:
        yield f"whatif.response_length={w.response_length!r} must be one of {list(LENGTH_MODELS)}"
    if w.response_length_mean is not None:
        if w.response_length != "lognormal":
            yield (
                f"whatif.response_length_mean={w.response_length_mean} only shapes "
                f"whatif.response_length=lognormal (it is {w.response_length!r}): set that, or "
                f"drop the mean"
            )
        elif w.response_length_mean <= 0:
            yield f"whatif.response_length_mean={w.response_length_mean} must be > 0 tokens"
    if w.response_length_sigma <= 0:
        yield f"whatif.response_length_sigma={w.response_length_sigma} must be > 0"
    if w.link is not None and w.hardware is None:
        yield (
            f"whatif.link={w.link!r} describes the network of whatif.hardware, which is not set: "
            f"set whatif.hardware too, or drop the link"
        )
    default_u = WhatifConfig.train_utilization
    if w.hardware is None and w.train_utilization != default_u:
        yield (
            f"whatif.train_utilization={w.train_utilization} scales the roofline of "
            f"whatif.hardware, which is not set (simulated devices take their time from "
            f"simulate.*): set whatif.hardware too, or drop whatif.train_utilization (default "
            f"{default_u})"
        )
    if w.hardware is not None:
        sim = getattr(cfg, "simulate", None)
        for key in DEVICE_TIME_KEYS:
            if sim is not None and getattr(sim, key, 0):
                yield (
                    f"simulate.{key}={getattr(sim, key)} models device time on simulated "
                    f"devices, but whatif.hardware={w.hardware!r} predicts real ones: drop "
                    f"simulate.{key} (or whatif.hardware)"
                )
