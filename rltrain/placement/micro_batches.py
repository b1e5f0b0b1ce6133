"""Micro-batch sizes left at null, chosen by the plan: the largest that fits.

``actor.micro_batch_size``, ``reference.micro_batch_size``, ``inference.micro_batch_size``,
``critic.micro_batch_size`` and ``reward.micro_batch_size`` default to null. Before anything
starts, :func:`choose_micro_batches` tries one size for all of them, largest first — a rank's
whole share of an optimizer step, then powers of two below it — and keeps the first whose plan
fits every device (a GPU within 85 % of its memory: the caching allocator's room). A size set
in the config is kept as it is. The tiny default run's share is
64 rows per actor rank, so it trains as it always has; a real model on real sequence lengths
gets the micro-batch its devices hold instead of a refusal.

Pure: no Ray, no torch. Reads :mod:`rltrain.placement.memory` through the plan only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rltrain.errors import RltrainError
from rltrain.kinds import registry

#: The config sections whose ``micro_batch_size`` the plan may choose.
SECTIONS = ("actor", "reference", "inference", "critic", "reward")

#: The size that stands for null where the plan does not choose: an embodied run (its actor
#: trains on whole environment batches; the plan's estimate keeps this many rows).
FALLBACK = 64

#: The share of a GPU's memory a chosen micro-batch may plan to use (see _fits_with_headroom).
CUDA_HEADROOM = 0.85


@dataclass(frozen=True)
class MicroBatchChoice:
    """What :func:`choose_micro_batches` decided.

    Attributes:
        chosen: ``{"actor.micro_batch_size": 8, ...}`` for every key that was null, as the
            run uses it (a placed component's value is at most its rows per optimizer step).
        placed: the chosen keys of components the plan places (the ones worth printing).
        fits: whether the plan fits with them (False: even one row per micro-batch does not;
            the plan's check then says what would).
    """

    chosen: dict[str, int]
    placed: tuple[str, ...] = ()
    fits: bool = True

    def describe(self) -> str:
        """One line for the plan's printout ("" when nothing was chosen)."""
        shown = [f"{k}={self.chosen[k]}" for k in self.placed]
        if not shown:
            return ""
        how = "the largest that fits" if self.fits else "none fits, even 1"
        return f"micro-batches chosen by the plan ({how}; set a key to fix it): {', '.join(shown)}"


def _auto(run: Any) -> list[str]:
    return [s for s in SECTIONS if getattr(getattr(run, s), "micro_batch_size", 0) is None]


def _with(run: Any, values: dict[str, int]) -> Any:
    """``run`` with ``values`` (section -> micro-batch size) replacing its micro-batch sizes."""
    changes = {
        s: dataclasses.replace(getattr(run, s), micro_batch_size=v) for s, v in values.items()
    }
    return dataclasses.replace(run, **changes)


def _candidates(run: Any) -> list[int]:
    """Sizes to try, largest first: a step's rows, then the powers of two below them."""
    total = max(1, run.trainer.train_batch_size * run.rollout.n_samples_per_prompt)
    out = [total]
    size = 1 << (total.bit_length() - 1)
    while size >= 1:
        if size < total:
            out.append(size)
        size //= 2
    return out


def _effective(plan: Any, run: Any, section: str, size: int) -> int:
    """The rows a micro-batch of ``size`` holds for ``section`` in ``plan`` (at most a rank's
    rows per optimizer step), as the plan counts them."""
    from rltrain.placement.plan import micro_batch

    name = section
    world = plan.world_size(name) if name in plan.components else 1
    model_parallel = 1
    if section in ("actor", "inference"):
        sec = getattr(run, section)
        model_parallel = sec.tensor_parallel_size * sec.pipeline_parallel_size
    return micro_batch(run, size, max(world // model_parallel, 1))


def choose_micro_batches(run: Any, cluster: Any = None) -> tuple[Any, MicroBatchChoice]:
    """Give every null micro-batch size the largest value whose plan fits.

    Args:
        run: a checked :class:`~rltrain.config.schema.RunConfig`.
        cluster: the :class:`~rltrain.placement.types.ClusterSpec` to plan on (None: the
            configured cluster).

    Returns:
        ``(run, choice)``: the run with every micro-batch size set (the same object when none
        was null), and what was chosen.
    """
    auto = _auto(run)
    if not auto:
        return run, MicroBatchChoice({})
    if not registry.runner(run).language_model:
        return _with(run, dict.fromkeys(auto, FALLBACK)), MicroBatchChoice(
            {f"{s}.micro_batch_size": FALLBACK for s in auto}
        )
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec

    try:
        spec = cluster if cluster is not None else ClusterSpec.from_config(run.cluster)
    except RltrainError:
        spec = None
    last: tuple[Any, Any, int] | None = None
    for size in _candidates(run):
        trial = _with(run, dict.fromkeys(auto, size))
        try:
            plan = build_plan(trial, spec, check_fit=False) if spec is not None else None
        except RltrainError:
            plan = None
        if plan is None:  # the placement itself is wrong: preflight reports it
            return trial, MicroBatchChoice({f"{s}.micro_batch_size": size for s in auto})
        last = (trial, plan, size)
        if _fits_with_headroom(plan):
            break
    assert last is not None  # _candidates is never empty
    trial, plan, size = last
    values = {s: _effective(plan, trial, s, size) for s in auto}
    placed = tuple(f"{s}.micro_batch_size" for s in auto if _uses(plan, trial, s))
    choice = MicroBatchChoice(
        {f"{s}.micro_batch_size": v for s, v in values.items()},
        placed,
        fits=not plan.fit_problems(),
    )
    return _with(run, values), choice


def _fits_with_headroom(plan: Any) -> bool:
    """The plan fits, and on CUDA devices within :data:`CUDA_HEADROOM` of each one's memory:
    torch's caching allocator needs room the byte count does not show (blocks split and cached
    between a step's passes), so a size the plan chooses leaves it. A size the config sets is
    held to the capacity itself."""
    if plan.fit_problems():
        return False
    cuda = {
        (n.rank, d)
        for n in plan.cluster.nodes
        if n.accelerator_type == "cuda"
        for d in range(n.num_devices)
    }
    return all(
        m.peak_bytes <= CUDA_HEADROOM * m.capacity_bytes
        for device, m in plan.memory.items()
        if device in cuda
    )


def _uses(plan: Any, run: Any, section: str) -> bool:
    """Whether the run reads ``<section>.micro_batch_size`` (its component is placed and,
    for the reward, is a model)."""
    if section not in plan.components:
        return False
    return section != "reward" or run.reward.kind == "model"


def adopt_micro_batches(run: Any, decided: Any) -> Any:
    """``run`` with the micro-batch sizes ``decided`` holds where ``run`` leaves them null.

    Only those sizes are taken: everything else of ``run`` stands (a caller may have changed
    other keys since, such as the checkpoint a restart resumes).

    Args:
        run: the config a job runs with.
        decided: the config the layout was made for (:attr:`RunLayout.run`), or None.

    Returns:
        ``run`` itself when nothing is left null or nothing was decided; else a copy.
    """
    if decided is None:
        return run
    values = {
        s: getattr(decided, s).micro_batch_size
        for s in _auto(run)
        if getattr(decided, s).micro_batch_size is not None
    }
    return _with(run, values) if values else run
