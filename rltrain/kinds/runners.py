"""The runner kinds (the value of ``runner``): their entries."""

from __future__ import annotations

from typing import Any

from rltrain.kinds.records import RunnerKind

#: The actor's side of a weight sync: its weights and the export buffer.
_EXPORT = ("weights", "weight_sync")


def _reasoning_overlap(run: Any) -> tuple[frozenset[str], ...]:
    """Asynchronous rollout generates while the actor trains."""
    return (frozenset({"actor", "rollout"}),) if run.trainer.max_staleness > 0 else ()


def _embodied_overlap(run: Any) -> tuple[frozenset[str], ...]:
    """Pipeline stages step the simulators while the rollout acts."""
    return (frozenset({"env", "rollout"}),) if run.env.pipeline_stage_num > 1 else ()


REASONING = RunnerKind(
    name="reasoning",
    summary="a language model learns from generated, scored responses (GRPO, PPO, ...)",
    entry="rltrain.runners.reasoning:run_reasoning",
    required=("actor", "rollout"),
    stages=(
        ("generate", {"rollout": ("*",)}),
        ("reward", {"reward": ("*",)}),
        ("logprob", {"reference": ("*",), "inference": ("*",)}),
        ("train", {"actor": ("*",), "critic": ("*",)}),
        ("sync", {"actor": _EXPORT, "rollout": ("weights",)}),
    ),
    language_model=True,
    fusable=True,
    overlap=_reasoning_overlap,
)

EMBODIED = RunnerKind(
    name="embodied",
    summary="a policy network acts in gym simulators and learns by PPO with GAE",
    entry="rltrain.runners.embodied:run_embodied",
    required=("actor", "rollout", "env"),
    stages=(
        ("generate", {"env": ("*",), "rollout": ("*",)}),
        ("logprob", {"reference": ("*",), "inference": ("*",)}),
        ("train", {"actor": ("*",), "critic": ("*",)}),
        ("sync", {"actor": ("weights",), "rollout": ("weights",)}),
    ),
    steps_env=True,
    engine_notes={
        "training": "the embodied actor trains its policy network with torch",
        "generation": "the embodied rollout runs its own policy network",
    },
    overlap=_embodied_overlap,
    pre_ray_components="rltrain.runners.embodied:check_components",
    env_spaces="rltrain.workers.env:probe_spaces",
    pre_ray_sizes="rltrain.runners.embodied:derive_sizes",
    ended_fields="rltrain.runners.embodied:ended_fields",
)
