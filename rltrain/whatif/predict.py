"""A run's predicted step: seconds per step and per stage, tokens/s and idle share per device.

:func:`predict` builds the step model from the run and its plan (on ``whatif.hardware`` when set:
the plan is then resolved on that hardware's memory, which sizes the KV cache), runs the run's
schedule for ``whatif.steps`` steps and reads the result the way a measured run is read: the step
period from the driver's step spans, stage times per step, each device's idle share from the
timeline (:func:`rltrain.telemetry.timeline.summarize`) over the steps after the first.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

import rltrain.whatif.hardware as hw
from rltrain.telemetry.timeline import chrome_trace_with_devices, covered, merge
from rltrain.whatif.calibrate import DEFAULT, Calibration
from rltrain.whatif.events import Sink, schedule_of, simulate
from rltrain.whatif.workload import (
    StepModel,
    inter_link,
    kv_tokens,
    moved_bytes,
    procs_of,
    sync_transport,
)

#: ``plan.json``'s key for the prediction.
PREDICTED = "predicted"


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts for one layout.

    Attributes:
        step_s: seconds per step (mean step period after the first step).
        stages_s: seconds per step of each stage, disjoint: ``generate`` includes the
            rollout's weight load and, taking turns, its reload and offload (as a generate
            timer that includes the switch measures it, verl's ``gen`` among them); ``moves``
            only the reloads and offloads outside it (the actor's; an embodied step's rollout
            offload too). The driver's time around the calls is in no stage, so their sum is
            at most ``step_s``; a fused step's ``step`` (its one call) holds its other stages.
        tokens_per_s_per_device: device lane -> tokens/s it processes (generated on it plus
            trained on it).
        idle_share: device lane -> share of the window it does nothing.
        hardware: the device model (``sim`` for simulated devices).
        schedule: ``fused``, ``turns``, ``pipelined`` or ``embodied``.
        calibration: where rltrain's runtime terms came from.
        steps: steps simulated.
        trace: the predicted timeline (a Chrome-trace document, as ``trace.json``).
    """

    step_s: float
    stages_s: dict[str, float]
    tokens_per_s_per_device: dict[str, float]
    idle_share: dict[str, float]
    hardware: str
    schedule: str
    calibration: str
    steps: int
    trace: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens_per_s_per_device.values())

    def to_dict(self) -> dict[str, Any]:
        """``plan.json``'s ``predicted`` block (the trace is written on its own)."""
        return {
            "step_s": self.step_s,
            "stages_s": dict(self.stages_s),
            "tokens_per_s_per_device": dict(self.tokens_per_s_per_device),
            "idle_share": dict(self.idle_share),
            "hardware": self.hardware,
            "schedule": self.schedule,
            "calibration": self.calibration,
            "steps": self.steps,
        }


def target_device(run: Any) -> hw.Device:
    """``whatif.hardware``'s device, else the simulated device."""
    name = getattr(getattr(run, "whatif", None), "hardware", None)
    return hw.device(name) if name else hw.SIM


def hardware_needed(run: Any, cluster: Any) -> str:
    """Why the configured cluster cannot be predicted as it is, or ``""`` when it can.

    Without ``whatif.hardware`` the simulator times simulated devices (the ``simulate.*``
    latencies their workers sleep); a cluster of real GPUs sleeps none of them, so its step
    needs the catalogue device it runs on.

    Args:
        run: the run config (``whatif.hardware`` read).
        cluster: the :class:`~rltrain.placement.types.ClusterSpec` planned on.

    Returns:
        One line naming ``whatif.hardware`` and the catalogue's devices, or ``""``.
    """
    if not target_device(run).simulated:
        return ""
    if not any(n.accelerator_type == "cuda" for n in cluster.nodes):
        return ""
    from rltrain.config.catalogue import entries

    return (
        "predicted: none: the cluster's devices are real GPUs (cluster.simulate_devices=false) "
        "and whatif.hardware=null times simulated devices only; set whatif.hardware to the GPU "
        f"the cluster runs on (one of {sorted(entries('devices'))}) to predict its step"
    )


def hardware_cluster(run: Any, cluster: Any, device: hw.Device) -> Any:
    """The cluster's nodes with the catalogue device (its memory, CUDA), or ``cluster``."""
    if device.simulated:
        return cluster
    from rltrain.placement.types import ClusterSpec

    section = dataclasses.replace(
        run.cluster, device_memory_gib=device.memory_gib, simulate_devices=False
    )
    return ClusterSpec.from_config(section)


def planned_cluster(run: Any) -> Any:
    """The cluster ``mode=plan`` resolves the plan on: the configured one, its devices those of
    ``whatif.hardware`` where that is set (their memory, CUDA), so the table, the fit check, the
    micro-batch sizes chosen and the prediction all describe the hardware asked about.

    Args:
        run: the checked run config.

    Returns:
        The :class:`~rltrain.placement.types.ClusterSpec`.
    """
    from rltrain.placement.types import ClusterSpec

    return hardware_cluster(run, ClusterSpec.from_config(run.cluster), target_device(run))


def plan_on_hardware(run: Any, plan: Any, device: hw.Device) -> Any:
    """The plan resolved on the catalogue device's memory (CUDA devices), or ``plan``."""
    if device.simulated:
        return plan
    from rltrain.placement.plan import build_plan

    return build_plan(run, hardware_cluster(run, plan.cluster, device), check_fit=False)


def predict(
    run: Any,
    plan: Any,
    fused: bool = False,
    calibration: Calibration | None = None,
    steps: int | None = None,
    with_trace: bool = True,
    planned_on_hardware: bool = False,
    exact_ranks: int | None = None,
) -> Prediction:
    """Predict a run's step on its plan.

    Args:
        run: the checked run config (``whatif.*`` read).
        plan: the run's plan on the configured cluster.
        fused: actor, rollout and reward run fused (``placement.fuse`` and the plan allow it).
        calibration: rltrain's runtime terms (default: :data:`~rltrain.whatif.calibrate.DEFAULT`).
        steps: steps to simulate (default ``whatif.steps``).
        with_trace: also build the predicted ``trace.json`` document.
        planned_on_hardware: ``plan`` is already resolved on ``whatif.hardware``'s devices.
        exact_ranks: decode only this many rollout ranks exactly per step (a ranking: the step
            needs the slowest); None: every rank (idle shares per device are then exact).

    Returns:
        The prediction.
    """
    w = getattr(run, "whatif", None)
    steps = int(steps or getattr(w, "steps", 20) or 20)
    device = target_device(run)
    if not planned_on_hardware:
        plan = plan_on_hardware(run, plan, device)
    procs = procs_of(plan)
    shares = bool(
        {d for p in procs.get("actor", ()) for d in p.devices}
        & {d for p in procs.get("rollout", ()) for d in p.devices}
    )
    model = StepModel(
        run,
        procs,
        device,
        inter_link(run, device),
        calibration or DEFAULT,
        fused=fused,
        kv_tokens=kv_tokens(plan, run),
        shares=shares,
        exact_ranks=exact_ranks,
        moved=moved_bytes(plan) if shares else {},
        transport=sync_transport(run, plan),
    )
    schedule, k, policy = schedule_of(run, fused)
    sampler = str(run.trainer.sampler) if schedule == "pipelined" else "in_order"
    sink = simulate(model, steps, schedule, k, policy, sampler)
    return _read(sink, model, plan, schedule, steps, with_trace)


def _read(
    sink: Sink, m: StepModel, plan: Any, schedule: str, steps: int, with_trace: bool
) -> Prediction:
    from rltrain.telemetry.timeline import plan_devices

    starts, last = steady_window(sink.step_starts)
    first = 1 if steps > 1 else 0
    periods = [b - a for a, b in zip(starts[first:], starts[first + 1 :], strict=False)]
    step_s = statistics.fmean(periods) if periods else 0.0
    kept = sink.stage_s[first:last]
    names = sorted({k for d in kept for k in d})
    stages = {n: statistics.fmean(d.get(n, 0.0) for d in kept) for n in names}
    devices = plan_devices(plan)
    window = (starts[first] * 1e6, starts[-1] * 1e6)
    idle = idle_shares(sink.spans, devices, window)
    tokens = statistics.fmean(sink.tokens[first:last]) if sink.tokens[first:last] else 0.0
    per_device = _tokens_per_device(m, tokens, step_s, devices)
    trace = predicted_trace(sink.spans, devices) if with_trace else {}
    return Prediction(
        step_s=step_s,
        stages_s=stages,
        tokens_per_s_per_device=per_device,
        idle_share=idle,
        hardware=m.device.name,
        schedule=schedule,
        calibration=m.calib.source,
        steps=steps,
        trace=trace,
    )


def steady_window(starts: list[float]) -> tuple[list[float], int]:
    """The step boundaries a run's steady state is read over, and the number of steps in it.

    ``starts`` holds each simulated step's start and the end of the last. A measured run is read
    from its step spans' starts (``rltrain trace``, the fidelity bench): the steps after the
    first up to the *start* of the last, whose end no span marks. The last step is also where a
    pipeline drains (no generation ahead of it), so the prediction is read the same way: with
    four or more steps the last one is left out.
    """
    if len(starts) >= 5:
        return starts[:-1], len(starts) - 2
    return starts, len(starts) - 1


#: Device lanes a predicted ``trace.json`` draws (a 1,024-device trace would be hundreds of MB);
#: the idle shares and the step cover every device.
TRACE_DEVICES = 64


def predicted_trace(spans: list, devices: list[str]) -> dict[str, Any]:
    """The predicted timeline as a Chrome-trace document: the first :data:`TRACE_DEVICES`
    devices, the processes on them and those without a device; ``otherData.predicted`` marks it."""
    shown = devices[:TRACE_DEVICES]
    keep = set(shown)
    chosen = [s for s in spans if not s.devices or keep.intersection(s.devices)]
    doc = chrome_trace_with_devices(chosen, shown)
    doc["otherData"].update(predicted=True, devices_total=len(devices))
    return doc


def idle_shares(spans: list, devices: list[str], window: tuple[float, float]) -> dict[str, float]:
    """Each device's idle share of ``window`` (µs): what no non-wait span covers, as
    :func:`rltrain.telemetry.timeline.summarize` counts it, over device lanes only."""
    lo, hi = window
    per: dict[str, list[tuple[float, float]]] = {d: [] for d in devices}
    for s in spans:
        if not s.devices or s.name.startswith("wait"):
            continue
        a, b = max(s.start_us, lo), min(s.start_us + s.dur_us, hi)
        if b > a:
            for d in s.devices:
                per.setdefault(d, []).append((a, b))
    width = hi - lo
    return {d: (1.0 - covered(merge(ivs)) / width) if width > 0 else 0.0 for d, ivs in per.items()}


def _tokens_per_device(
    m: StepModel, gen_tokens: float, step_s: float, devices: list[str]
) -> dict[str, float]:
    """Generated tokens on the rollout's devices plus trained tokens on the actor's, per second."""
    out = dict.fromkeys(devices, 0.0)
    if step_s <= 0:
        return out
    trained = m.tokens() if not m.sim else gen_tokens
    for comp, total in (("rollout", gen_tokens), ("actor", trained)):
        procs = [p for p in m.procs.get(comp, ()) if p.devices]
        if comp == "rollout" and m.fused:
            procs = [p for p in m.procs.get("actor", ()) if p.devices]
        for p in procs:
            for d in p.devices:
                out[d] = out.get(d, 0.0) + total / len(procs) / len(p.devices) / step_s
    return out
