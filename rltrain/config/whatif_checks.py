"""The checks of the ``whatif`` section (the what-if step simulator, :mod:`rltrain.whatif`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from rltrain.config.catalogue import problems as catalogue_problems
from rltrain.config.checks import check
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
    yield from _length_problems(w)
    if w.link is not None and w.hardware is None:
        yield (
            f"whatif.link={w.link!r} describes the network of whatif.hardware, which is not set: "
            f"set whatif.hardware too, or drop the link"
        )
    nodes = getattr(getattr(cfg, "cluster", None), "num_nodes", None)
    if w.link is not None and w.hardware is not None and nodes == 1:
        # the predicted cluster has the configured cluster's nodes, and every candidate of a
        # ranking fits on them: with one node nothing crosses a link between nodes
        yield (
            f"whatif.link={w.link!r} is the link between nodes, and cluster.num_nodes=1 has "
            f"one: no plan or candidate crosses it; set cluster.num_nodes to the nodes you mean "
            f"to predict (with cluster=ray), or drop whatif.link"
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


def _length_problems(w: WhatifConfig) -> Iterator[str]:
    """The response-length model's keys: a known model, and its shape keys only with it."""
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
    default_sigma = WhatifConfig.response_length_sigma
    if w.response_length != "lognormal" and w.response_length_sigma != default_sigma:
        yield (
            f"whatif.response_length_sigma={w.response_length_sigma} only shapes "
            f"whatif.response_length=lognormal (it is {w.response_length!r}): set that, or "
            f"drop the sigma (default {default_sigma})"
        )
    elif w.response_length_sigma <= 0:
        yield f"whatif.response_length_sigma={w.response_length_sigma} must be > 0"


@check
def whatif_unread(cfg: Any) -> Iterator[str]:
    """``whatif.*`` keys set away from their defaults in a training run that reads none of them.

    Only ``mode=plan`` (its prediction and ranking) and ``placement=auto`` (its ranking's
    simulator column and ``carry`` share) read the section; a training run of a layout chosen by
    hand never does, so a value set there would change nothing. A run with ``placement.mode``
    null is not refused: placement=auto's candidates are such configs
    (:func:`rltrain.whatif.candidates.apply`), checked and profiled with the search's own
    ``whatif`` section.

    Args:
        cfg: the run config.

    Returns:
        An iterator of one problem per key, naming it, its value and the fix.
    """
    w = getattr(cfg, "whatif", None)
    placement = getattr(getattr(cfg, "placement", None), "mode", None)
    if w is None or getattr(cfg, "mode", "train") != "train" or placement in (None, "auto"):
        return
    default = WhatifConfig()
    for f in dataclasses.fields(WhatifConfig):
        value = getattr(w, f.name)
        if value != getattr(default, f.name):
            yield (
                f"whatif.{f.name}={value!r} is read only by mode=plan and placement=auto, and "
                f"this is a training run of placement={placement}: run python -m rltrain "
                f"mode=plan with the same keys to predict it, use placement=auto to let the "
                f"simulator rank layouts, or drop whatif.{f.name}"
            )
