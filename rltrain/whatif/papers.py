"""Published step times of other RL frameworks, predicted from their stated setups.

A :class:`Figure` is a number a framework published: one layout's seconds per step, or the
ratio of two layouts' step times on the same workload. Its :class:`Setup` holds what the source
states (model, GPU, prompts and responses per step, response budget, layouts). Two inputs the
sources leave out, the mean response length and the training's share of the BF16 peak, are
fitted to the published stage times of one synchronous layout of the same size (its
``generate`` and ``update_actor`` seconds: a profile of that layout, :func:`fit`), and the other
layout is then predicted. :func:`reproduce` builds each layout as an
rltrain run config on the catalogue hardware and returns the simulator's figure.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from rltrain.whatif import hardware as hw

#: Qwen2.5-7B / Qwen2.5-Math-7B shape (config.json of the Hugging Face checkpoints).
QWEN25_7B = {
    "family": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_layers": 28,
    "num_heads": 28,
    "num_kv_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "dtype": "bfloat16",
}

VERL_ASYNC = "https://verl.readthedocs.io/en/latest/advance/fully_async.html"
VERL_ONE_STEP = "https://github.com/volcengine/verl/blob/main/docs/advance/one_step_off.md"


@dataclass(frozen=True)
class Layout:
    """Where actor and rollout run (device ranges of ``nodes`` nodes of 8 GPUs) and the
    staleness (0: synchronous; actor and rollout on the same devices: taking turns)."""

    nodes: int
    actor: str
    rollout: str
    staleness: int = 0
    partial_rollout: str = "finish"


@dataclass(frozen=True)
class Setup:
    """A published workload.

    Attributes:
        name: a short label.
        hardware: the catalogue device.
        prompts: prompts per step; ``samples`` responses each.
        prompt_tokens: mean prompt tokens (math problems: a few hundred; assumed 256).
        max_response: the response budget.
        fit_layout: the layout whose published generation seconds ``fit_generate_s`` fix the
            mean response length (log-normal, sigma 1) and whose update seconds
            ``fit_train_s`` fix the training utilization.
        source: where the setup is published.
    """

    name: str
    hardware: str
    prompts: int
    samples: int
    prompt_tokens: int
    max_response: int
    fit_layout: Layout
    fit_generate_s: float
    fit_train_s: float
    source: str


@dataclass(frozen=True)
class Figure:
    """A published figure: ``step(base)`` seconds, or ``step(base) / step(other)``; with
    ``stage``, that stage's seconds instead of the step's."""

    name: str
    published: float
    setup: Setup
    base: Layout
    other: Layout | None = None
    source: str = ""
    stage: str = ""


#: verl's one-step-off runs: Qwen2.5-Math-7B, DAPO, 2 nodes x 8 H20, vLLM rollout; profiled by the
#: colocated synchronous run: its generate call (``generate_sequences``: the ``gen`` timer also
#: holds the hybrid engine's switch between training and generation), ``old_log_prob`` and
#: ``update_actor`` on the actor's devices. Prompts per step are not stated: verl's DAPO
#: recipe's 512 x 16. FSDP2 runs: 20,480-token budget, 247 s, 88 + 286 s; Megatron runs:
#: 8,192 tokens, 162 s, 119 + 344 s.
ONE_STEP = Setup(
    "verl one-step-off (FSDP2), Qwen2.5-Math-7B, 16 H20",
    "h20",
    512,
    16,
    256,
    20480,
    Layout(2, "0-15", "0-15"),
    247.0,
    88.0 + 286.0,
    VERL_ONE_STEP,
)
ONE_STEP_MEGATRON = dataclasses.replace(
    ONE_STEP,
    name="verl one-step-off (Megatron), Qwen2.5-Math-7B, 16 H20",
    max_response=8192,
    fit_generate_s=162.0,
    fit_train_s=119.0 + 344.0,
)
_SPLIT = Layout(2, "0-11", "12-15", 1)


def _one_step(s: Setup, engine: str, sync_s: float, step_s: float, gen4_s: float) -> tuple:
    """verl's three one-step-off figures of one engine: the overlapped step (12 train + 4
    rollout GPUs), its speed-up over the colocated synchronous step, and the 4 rollout GPUs'
    generate call against the 16 colocated GPUs'."""
    return (
        Figure(
            f"one-step-overlap step, 12 train + 4 rollout H20 ({engine})",
            step_s,
            s,
            _SPLIT,
            source=s.source,
        ),
        Figure(
            f"speed-up, one-step-overlap vs colocate sync, 16 H20 ({engine})",
            sync_s / step_s,
            s,
            s.fit_layout,
            _SPLIT,
            s.source,
        ),
        Figure(
            f"generation on 4 rollout H20 / on all 16 ({engine}: generate_sequences "
            f"{gen4_s:.0f} s / {s.fit_generate_s:.0f} s)",
            gen4_s / s.fit_generate_s,
            s,
            Layout(2, "0-11", "12-15"),
            s.fit_layout,
            s.source,
            stage="generate",
        ),
    )


def _dapo(gpus: int, generate_s: float, train_s: float) -> Setup:
    """verl's DAPO runs of Qwen2.5-Math-7B on H20 (512 prompts x 16, 28K response budget),
    profiled by the colocated synchronous run on ``gpus`` GPUs."""
    return Setup(
        f"verl DAPO 7B, {gpus} H20",
        "h20",
        512,
        16,
        256,
        28672,
        Layout(gpus // 8, f"0-{gpus - 1}", f"0-{gpus - 1}"),
        generate_s,
        train_s,
        VERL_ASYNC,
    )


#: (GPUs, colocate-sync gen s, update_actor s, fully-async step s) from verl's table (its runs
#: use partial rollouts: ``continue``). Only ``gen`` is published for these runs.
_VERL = ((32, 357.41, 313.81, 294.77), (64, 150.72, 133.41, 189.26), (128, 177.85, 113.81, 150.63))

FIGURES: tuple[Figure, ...] = (
    _one_step(ONE_STEP, "FSDP2", 749.0, 520.0, 458.0)
    + _one_step(ONE_STEP_MEGATRON, "Megatron", 699.0, 566.0, 501.0)
    + tuple(
        Figure(
            f"fully async {g // 2}:{g // 2} step, {g} H20",
            step,
            _dapo(g, gen, train),
            Layout(g // 8, f"0-{g // 2 - 1}", f"{g // 2}-{g - 1}", 1, "continue"),
            source=VERL_ASYNC,
        )
        for g, gen, train, step in _VERL
    )
    + (
        Figure(
            "speed-up, fully async 64:64 vs colocate sync, 128 H20",
            356.30 / 150.63,
            _dapo(128, 177.85, 113.81),
            Layout(16, "0-127", "0-127"),
            Layout(16, "0-63", "64-127", 1, "continue"),
            VERL_ASYNC,
        ),
    )
)


def run_for(s: Setup, layout: Layout, mean_response: float, utilization: float = 0.4) -> Any:
    """The rltrain run config of one layout of a setup (vLLM rollout, ZeRO-3 actor)."""
    from rltrain.config import schema as c

    run = c.RunConfig()
    shared = layout.actor == layout.rollout
    offload = {}
    if shared:
        offload = {
            "actor": c.OffloadPolicyConfig("on_demand", ["weights", "grads", "optimizer"]),
            "rollout": c.OffloadPolicyConfig("on_demand", ["weights", "kv_cache"]),
        }
    return dataclasses.replace(
        run,
        mode="plan",
        cluster=dataclasses.replace(
            run.cluster,
            num_nodes=layout.nodes,
            devices_per_node=8,
            simulate_devices=False,
            device_memory_gib=hw.device(s.hardware).memory_gib,
        ),
        placement=dataclasses.replace(
            run.placement,
            component_placement={"actor": layout.actor, "rollout": layout.rollout},
            offload=offload,
        ),
        model=dataclasses.replace(run.model, **QWEN25_7B),
        task=dataclasses.replace(run.task, max_prompt_length=s.prompt_tokens),
        rollout=dataclasses.replace(
            run.rollout,
            backend="vllm",
            n_samples_per_prompt=s.samples,
            max_new_tokens=s.max_response,
            gpu_memory_utilization=0.8,
        ),
        actor=dataclasses.replace(
            run.actor,
            backend="deepspeed",
            zero_stage=3,
            micro_batch_size=1,
            gradient_checkpointing=True,
        ),
        trainer=dataclasses.replace(
            run.trainer,
            train_batch_size=s.prompts,
            max_staleness=layout.staleness,
            partial_rollout=layout.partial_rollout,
        ),
        whatif=dataclasses.replace(
            run.whatif,
            hardware=s.hardware,
            response_length="lognormal",
            response_length_mean=mean_response,
            response_length_sigma=1.0,
            train_utilization=utilization,
            steps=4,
        ),
    )


def predict_layout(s: Setup, layout: Layout, mean_response: float, utilization: float) -> Any:
    """The simulator's prediction of one layout."""
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec
    from rltrain.whatif.predict import predict

    run = run_for(s, layout, mean_response, utilization)
    plan = build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)
    return predict(run, plan, with_trace=False)


@functools.lru_cache(maxsize=8)
def fit(s: Setup) -> tuple[float, float]:
    """``(mean response, training utilization)`` at which the fit layout's predicted
    generation and update take the published seconds. Generation does not depend on the
    utilization (bisection on the mean); the update is inversely proportional to it."""
    lo, hi = 64.0, s.max_response / 2
    for _ in range(20):
        mid = (lo + hi) / 2
        gen = predict_layout(s, s.fit_layout, mid, 0.4).stages_s.get("generate", 0.0)
        lo, hi = (mid, hi) if gen < s.fit_generate_s else (lo, mid)
    mean = (lo + hi) / 2
    u = 0.4
    for _ in range(3):
        train = predict_layout(s, s.fit_layout, mean, u).stages_s.get("train", 0.0)
        u = min(1.0, u * train / s.fit_train_s)
    return mean, u


def reproduce(f: Figure) -> float:
    """The simulator's value of a published figure."""
    mean, u = fit(f.setup)

    def value(layout: Layout) -> float:
        p = predict_layout(f.setup, layout, mean, u)
        return p.stages_s.get(f.stage, 0.0) if f.stage else p.step_s

    base = value(f.base)
    return base if f.other is None else base / value(f.other)


def breakdown(f: Figure) -> dict[str, Any]:
    """The fitted inputs and each layout's predicted stages (for the docs' table)."""
    mean, u = fit(f.setup)
    out: dict[str, Any] = {"mean_response": mean, "train_utilization": u}
    for key, layout in (("base", f.base), ("other", f.other)):
        if layout is not None:
            p = predict_layout(f.setup, layout, mean, u)
            out[key] = {"step_s": p.step_s, **p.stages_s}
    return out
