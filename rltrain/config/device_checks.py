"""Checks of settings that only make sense on one kind of device.

``simulate.*`` adds modelled device time to every stage, so that schedules and placements can
be compared on CPU as they would behave on devices. On real GPUs the stages take real device
time: the sleeps would slow the run and corrupt every timing it records, so a run with real
devices and any ``simulate.*`` latency is refused. Before Ray starts that is known for a local
Ray on a machine whose NVIDIA driver lists GPUs (registered check below); a joined cluster's
devices are known once Ray reports them, and :func:`simulated_latency_problem` is asked again
then (``rltrain.runners.job.start_job``), before any worker starts.

Registered with :func:`rltrain.config.checks.check`; no torch, no Ray.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import rltrain.config.engine_checks as engine_checks
from rltrain.config.checks import check
from rltrain.config.schema import RunConfig


def simulated_latencies(cfg: RunConfig) -> dict[str, float]:
    """The ``simulate.*`` keys set above 0, by full key."""
    return {
        f"simulate.{f.name}": float(getattr(cfg.simulate, f.name))
        for f in dataclasses.fields(cfg.simulate)
        if getattr(cfg.simulate, f.name) > 0
    }


def simulated_latency_problem(cfg: RunConfig, devices: str) -> str | None:
    """The refusal of ``simulate.*`` latencies on real devices, or None when none is set.

    Args:
        cfg: the run config.
        devices: what the real devices are, for the message ("this machine's 8 GPUs").
    """
    on = simulated_latencies(cfg)
    if not on:
        return None
    keys = ", ".join(f"{k}={v:g}" for k, v in on.items())
    return (
        f"{keys}: simulate.* adds modelled device time for runs on simulated devices, but "
        f"this run's devices are real ({devices}), whose stages take real time: set "
        f"{' '.join(f'{k}=0' for k in on)}"
    )


@check
def _simulated_latency_on_gpus(cfg: RunConfig) -> Iterator[str]:
    """A local Ray on a machine with GPUs uses them (it never simulates devices there)."""
    if cfg.cluster.address is None and engine_checks.local_gpus_visible():
        problem = simulated_latency_problem(cfg, "cluster=local on a machine with NVIDIA GPUs")
        if problem:
            yield problem
