"""Where the clipped ratio's pi_old comes from (``algorithm.old_logprobs``), decided once.

``recompute``: pi_old is the actor's own log-probs of the batch under its weights before the
update (the inference component's, when one is placed); where the rollout's log-probs exist the
policy loss is weighted per token by ``min(pi_old / pi_rollout, algorithm.tis_cap)`` (truncated
importance sampling). ``rollout``: pi_old is the rollout engine's log-probs as sampled; the
ratio is then taken against the sampling distribution itself. ``auto`` picks ``recompute`` where
the rollout's numbers are not the actor's own numerics or are stale, else keeps what a
synchronous torch run has always done (:func:`resolve_old_logprobs`). The formulas and their
cost are in ``docs/rl_core.md``.

Pure: no torch, no Ray; the workers, the cost model and the checks all ask here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rltrain.config.checks import check
from rltrain.config.ranks import parse_ranks
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.kinds import registry

#: ``algorithm.old_logprobs`` values.
OLD_LOGPROB_SOURCES = ("auto", "recompute", "rollout")


def placed_components(run: Any) -> set[str]:
    """Component names the placement places (``"actor,rollout"`` keys split)."""
    keys = getattr(getattr(run, "placement", None), "component_placement", None) or {}
    return {n.strip() for k in keys for n in str(k).split(",")}


def device_placement_keys(run: Any) -> list[str]:
    """The ``placement.component_placement`` keys placed on the cluster's devices, as written
    (``"actor,rollout"`` not split).

    A key is on devices when it has no ``node_group``, ``node_group: cluster``, or lists a node
    group of accelerators: one without ``hardware`` whose nodes have devices (the reserved
    ``node`` group, hardware groups and groups of device-less nodes count nodes or hardware
    units instead, as :func:`rltrain.placement.resources.resource_space` numbers them).

    Args:
        run: the run config.

    Returns:
        The keys, in the order written.
    """
    keys = getattr(getattr(run, "placement", None), "component_placement", None) or {}
    return [str(k) for k, v in keys.items() if _on_devices(run, v) is True]


def node_placement_keys(run: Any) -> list[str]:
    """The ``placement.component_placement`` keys placed only on nodes or non-accelerator
    hardware (every node group they list is known and has no accelerators), as written.

    Args:
        run: the run config.

    Returns:
        The keys, in the order written; a key naming an undefined group is in neither this
        list nor :func:`device_placement_keys` (the placement check reports it).
    """
    keys = getattr(getattr(run, "placement", None), "component_placement", None) or {}
    return [str(k) for k, v in keys.items() if _on_devices(run, v) is False]


def _on_devices(run: Any, value: Any) -> bool | None:
    """Whether a placement value addresses accelerators; None where a group it lists is not
    defined or not readable."""
    groups = value.get("node_group") if isinstance(value, Mapping) else None
    if groups is None:
        return True
    labels = [s.strip() for s in groups.split(",")] if isinstance(groups, str) else groups
    answers = [_group_has_devices(run, str(label)) for label in labels]
    if True in answers:
        return True
    return None if None in answers else False


def _group_has_devices(run: Any, label: str) -> bool | None:
    """Whether node group ``label`` numbers accelerators (None: undefined or unreadable)."""
    if label == "cluster":
        return True
    if label == "node":
        return False
    cluster = getattr(run, "cluster", None)
    per_node = getattr(cluster, "devices_per_node", 0)
    for group in getattr(cluster, "node_groups", None) or []:
        get = group.get if isinstance(group, Mapping) else lambda k, g=group: getattr(g, k, None)
        if str(get("label")) != label:
            continue
        if get("hardware"):
            return False
        try:
            ranks = parse_ranks(get("node_ranks"), "node_ranks")
            counts = [per_node[r] if isinstance(per_node, Sequence) else per_node for r in ranks]
            return any(int(c) > 0 for c in counts)
        except (ConfigError, IndexError, TypeError, ValueError):
            return None
    return None


def numerics_mismatches(run: Any) -> list[str]:
    """Why the rollout's log-probs are not what the actor's forward pass computes for the same
    weights (empty when they are, up to float rounding).

    Args:
        run: the run config.

    Returns:
        One reason per difference, naming the key.
    """
    out = []
    engine = registry.engine_names("generation")
    if run.rollout.backend in engine and registry.generation_engine(run).own_kernels:
        out.append(f"rollout.backend={run.rollout.backend!r} computes with its own kernels")
    if run.model.dtype != "float32":
        out.append(
            f"model.dtype={run.model.dtype!r}: KV-cached decoding rounds 16-bit activations "
            f"differently from the trainer's full forward pass"
        )
    if run.actor.lora.rank > 0:
        out.append("actor.lora.rank > 0: the rollout holds the merged weights W + s·BA")
    if run.rollout.top_p < 1.0:
        out.append(
            f"rollout.top_p={run.rollout.top_p}: the sampler's log-probs are those of the "
            f"renormalised nucleus, the trainer's those of the full softmax"
        )
    return out


def resolve_old_logprobs(run: Any) -> str:
    """``algorithm.old_logprobs`` with ``auto`` decided: ``recompute`` or ``rollout``.

    ``auto`` is ``recompute`` when the rollout's log-probs are not the actor's own numerics
    (:func:`numerics_mismatches`), when batches may be stale (``trainer.max_staleness >= 1``),
    or when an inference component is placed (it recomputes pi_old on its own devices).
    Otherwise it is what a synchronous torch run did before the key existed: the rollout's
    log-probs when they were recorded for a KL in the reward, else the actor's own.

    Args:
        run: the run config.

    Returns:
        ``recompute`` or ``rollout``.
    """
    a = run.algorithm
    if a.old_logprobs != "auto":
        return str(a.old_logprobs)
    if numerics_mismatches(run) or run.trainer.max_staleness >= 1:
        return "recompute"
    if "inference" in placed_components(run):
        return "recompute"
    kl_in_reward = a.kl_in == "reward" and a.kl_coef > 0
    return "rollout" if kl_in_reward else "recompute"


def old_logprob_pass(run: Any) -> bool:
    """Whether the actor runs a forward pass of its own for pi_old before each update.

    Only with ``recompute``, no inference component, and more than one optimizer step per
    batch: with one epoch of one minibatch the update's first forward pass is at the weights
    before the update, and its log-probs (detached) are pi_old at no cost.
    """
    a = run.algorithm
    multi = a.ppo_epochs > 1 or a.num_minibatches > 1
    return (
        resolve_old_logprobs(run) == "recompute"
        and multi
        and "inference" not in placed_components(run)
    )


@check
def _old_logprobs(cfg: RunConfig) -> Iterator[str]:
    a = cfg.algorithm
    if a.old_logprobs not in OLD_LOGPROB_SOURCES:
        yield (
            f"algorithm.old_logprobs={a.old_logprobs!r} is not valid: choose one of "
            f"{list(OLD_LOGPROB_SOURCES)} (auto: recompute where the rollout's numerics differ "
            f"or batches are stale)"
        )
        return
    if a.tis_cap is not None and not a.tis_cap >= 1.0:
        yield (
            f"algorithm.tis_cap={a.tis_cap} must be at least 1 (the cap C of min(pi_old / "
            f"pi_rollout, C): below 1 it would shrink tokens on which both policies agree), "
            f"or null for no correction"
        )
    language = cfg.runner not in registry.runner_names() or registry.runner(cfg).language_model
    if not language and a.old_logprobs != "auto":
        yield (
            f"algorithm.old_logprobs={a.old_logprobs!r} with runner={cfg.runner!r}: the embodied "
            f"PPO takes its behaviour log-probs from its own rollout; leave it auto"
        )
    if a.old_logprobs == "rollout" and "inference" in placed_components(cfg):
        yield (
            "algorithm.old_logprobs='rollout' with an inference component placed: the "
            "inference component only recomputes pi_old, which 'rollout' would not use; drop "
            "the inference placement, or use algorithm.old_logprobs=recompute (or auto)"
        )
