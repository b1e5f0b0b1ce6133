"""Rank the candidates by predicted step time, check them in that order, pick the winner.

:func:`rank` and :func:`pick` are pure (no Ray, no torch, no plan): on 1,024 nodes x 8 devices
they order ~24,600 reasoning candidates in well under a second. :func:`verify` then checks
candidates fastest-predicted first with what training itself checks before Ray starts (the
config's checks, the plan's memory model and :func:`rltrain.runners.layout.preflight`, as for
the same layout set by hand), and stops once the winner is settled: every candidate predicted
within :data:`TIE` of the fastest valid one has been checked. Small searches (at most
``placement.auto.max_checked`` candidates) are checked whole, so the printed ranking shows why
each layout was excluded.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rltrain.autoplace.candidates import PARTIAL_ROLLOUTS, Candidate, apply, as_set_by_hand
from rltrain.autoplace.cost import EmbodiedCosts, Prediction, ReasoningCosts, predict
from rltrain.errors import ConfigError, RltrainError
from rltrain.kinds import registry

#: Predictions closer than this share (1 %) are below the model's resolution: among them the
#: simpler layout wins (synchronous before asynchronous, fewer processes before more).
TIE = 0.01
#: Family order of that preference.
FAMILY_ORDER = {"collocated": 0, "hybrid": 1, "disaggregated": 2}

OK, EXCLUDED, UNCHECKED = "ok", "excluded", "unchecked"


@dataclass(frozen=True)
class Row:
    """One candidate in the ranking.

    Attributes:
        candidate: the layout.
        prediction: its predicted seconds per step.
        status: ``ok`` (passes every check), ``excluded`` (``reason`` says why) or
            ``unchecked`` (predicted slower than the winner, not checked).
        reason: why it was excluded.
        peak_bytes: the plan's predicted peak device memory (checked rows).
        plan_mode: the plan's mode for the layout (checked rows).
    """

    candidate: Candidate
    prediction: Prediction
    status: str = UNCHECKED
    reason: str = ""
    peak_bytes: int | None = None
    plan_mode: str | None = None

    @property
    def seconds(self) -> float:
        return self.prediction.seconds

    def to_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "candidate": c.name,
            "family": c.family,
            "actor_devices": c.actor_devices,
            "rollout_devices": c.rollout_devices,
            "env_devices": c.env_devices,
            "fused": c.fused,
            "max_staleness": c.staleness,
            "partial_rollout": c.partial_rollout,
            "pipeline_stages": c.stages,
            "predicted_s_per_step": self.seconds,
            "prediction": self.prediction.to_dict(),
            "predicted_peak_bytes": self.peak_bytes,
            "plan_mode": self.plan_mode,
            "status": self.status,
            "reason": self.reason,
        }


def preference(c: Candidate) -> tuple:
    """Order among predictions within :data:`TIE`: synchronous, then ``finish`` (then
    ``continue``, then ``restart``: the less generated work thrown away or redone), then fused,
    then fewer kinds of processes, then more pipeline stages only if needed, then a balanced
    split."""
    balance = abs(c.rollout_devices - c.actor_devices)
    policy = PARTIAL_ROLLOUTS.index(c.partial_rollout)
    family = FAMILY_ORDER.get(c.family, 9)
    return (c.staleness, policy, not c.fused, family, c.stages or 0, balance)


def rank(
    candidates: Iterable[Candidate],
    costs: ReasoningCosts | EmbodiedCosts,
    busy: Callable[[int, int], float] | None = None,
) -> list[Row]:
    """Predict every candidate and sort them, fastest first (ties by :func:`preference`).

    Args:
        candidates: the layouts.
        costs: the profile's fitted costs.
        busy: ``carry`` candidates' share of a static batch's decoding, by rollout devices
            and bound (:func:`rltrain.autoplace.cost.predict`).

    Returns:
        Unchecked rows.
    """
    # Tens of thousands of small records at once: the cyclic garbage collector would walk the
    # whole heap several times meanwhile (in a long-lived driver, 5x the search's own time);
    # none of them forms a cycle.
    paused = gc.isenabled()
    gc.disable()
    try:
        rows = [Row(c, predict(c, costs, busy)) for c in candidates]
    finally:
        if paused:
            gc.enable()
    rows.sort(key=lambda r: (r.seconds, preference(r.candidate)))
    return rows


def pick(rows: Sequence[Row], tie: float = TIE) -> Row | None:
    """The winner: among valid rows predicted within ``tie`` of the fastest valid one, the
    most preferred (:func:`preference`).

    Returns:
        The winning row, or None when no row is valid.
    """
    ok = [r for r in rows if r.status == OK]
    if not ok:
        return None
    best = min(r.seconds for r in ok)
    near = [r for r in ok if r.seconds <= best * (1 + tie)]
    return min(near, key=lambda r: (preference(r.candidate), r.seconds))


def ordered(rows: Sequence[Row], winner: Row | None) -> list[Row]:
    """The ranking as printed: the winner first, then the others by predicted time."""
    rest = [r for r in rows if r is not winner]
    return ([winner] if winner is not None else []) + rest


Check = Callable[[Any, Candidate], tuple[str, int | None, str | None]]


def verify(
    run: Any,
    rows: Sequence[Row],
    max_checked: int,
    check: Check | None = None,
    precheck: Callable[[Any, Candidate], str] | None = None,
) -> list[Row]:
    """Check rows fastest-predicted first until the winner is settled.

    Every row is first given the cheap ``precheck`` (the batch sizes), which does not count
    against ``max_checked``: on a large cluster most splits do not divide the batch. The rows
    that pass get the full ``check``. With at most ``max_checked`` rows every row is checked.
    Otherwise checking stops once a valid row exists and the next row is predicted more than
    :data:`TIE` slower than it (no later row can win), or after ``max_checked`` full checks.

    Args:
        run: the base run config.
        rows: the ranked rows (:func:`rank`).
        max_checked: ``placement.auto.max_checked``.
        check: ``(run, candidate) -> (reason or "", peak bytes, plan mode)``; default
            :func:`check_candidate` (the config's checks, the plan and preflight).
        precheck: ``(run, candidate) -> reason or ""``; default :func:`size_problem`.

    Returns:
        The rows with ``status`` (and ``reason``, ``peak_bytes``, ``plan_mode``) filled.
    """
    check = check or check_candidate
    precheck = precheck or size_problem
    check_all = len(rows) <= max_checked
    out: list[Row] = []
    best_ok: float | None = None
    checked = 0
    for row in rows:
        settled = best_ok is not None and row.seconds > best_ok * (1 + TIE)
        if checked >= max_checked or (settled and not check_all):
            out.append(replace(row, status=UNCHECKED, reason=""))
            continue
        reason = precheck(run, row.candidate)
        if reason:
            out.append(replace(row, status=EXCLUDED, reason=reason))
            continue
        reason, peak, mode = check(run, row.candidate)
        checked += 1
        status = EXCLUDED if reason else OK
        if status == OK and best_ok is None:
            best_ok = row.seconds
        out.append(replace(row, status=status, reason=reason, peak_bytes=peak, plan_mode=mode))
    return out


def size_problem(run: Any, cand: Candidate) -> str:
    """Why a reasoning candidate's world sizes do not divide the batch, or "" (cheap: the
    rule :func:`rltrain.placement.sizes.derive_sizes` applies before Ray starts)."""
    if not registry.runner(run).language_model or not _one_device_per_process(run):
        return ""
    from rltrain.placement.sizes import derive_sizes

    try:
        derive_sizes(run, cand.actor_devices, cand.rollout_devices)
    except ConfigError as exc:
        return "; ".join(exc.problems)
    return ""


def check_candidate(run: Any, cand: Candidate) -> tuple[str, int | None, str | None]:
    """What training would refuse of a candidate before Ray starts, as it would refuse the same
    layout set by hand.

    The reasoning batch sizes are checked first (:func:`size_problem`), then the candidate's
    config with the config's own checks (:func:`rltrain.config.validate.check_config`), then
    the plan on the configured cluster with its memory model (micro-batches left null sized for
    this layout: :func:`candidate_run`), then :func:`rltrain.runners.layout.preflight` on that
    plan.

    Args:
        run: the base run config.
        cand: the candidate.

    Returns:
        ``(reason, peak bytes, plan mode)``; ``reason`` is empty when it passes.
    """
    from rltrain.config.validate import check_config
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec
    from rltrain.runners.layout import preflight

    reason = size_problem(run, cand)
    if reason:
        return reason, None, None
    problems = check_config(as_set_by_hand(apply(run, cand)))[1]
    if problems:
        return "; ".join(problems), None, None
    cand_run = candidate_run(run, cand)
    try:
        plan = build_plan(cand_run, ClusterSpec.from_config(run.cluster), check_fit=False)
    except RltrainError as exc:
        return str(exc), None, None
    peak = max((m.peak_bytes for m in plan.memory.values()), default=0)
    mode = getattr(plan.mode, "value", str(plan.mode))
    try:
        preflight(cand_run, None, plan)
    except ConfigError as exc:
        return "; ".join(exc.problems), peak, mode
    except RltrainError as exc:
        return str(exc), peak, mode
    return "", peak, mode


def candidate_run(run: Any, cand: Candidate) -> Any:
    """The config a candidate trains with: :func:`~rltrain.autoplace.candidates.apply`, with
    every micro-batch size the config leaves null chosen for the candidate's own layout (the
    largest that fits, as a run of that layout set by hand gets:
    :func:`rltrain.placement.micro_batches.choose_micro_batches`).

    Args:
        run: the base run config (its null micro-batch sizes still null).
        cand: the candidate.

    Returns:
        A new run config.
    """
    from rltrain.placement.micro_batches import choose_micro_batches

    return choose_micro_batches(apply(run, cand))[0]


def _one_device_per_process(run: Any) -> bool:
    """Whether a component's processes equal its devices (no tensor/pipeline parallelism)."""
    sections = (run.actor, run.rollout)
    return all(
        getattr(s, "tensor_parallel_size", 1) == 1 and getattr(s, "pipeline_parallel_size", 1) == 1
        for s in sections
    )


# ---------------------------------------------------------------------------------- printing
def _gib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**30:.3g} GiB"


def render(rows: Sequence[Row], winner: Row | None, header: str = "", top: int = 20) -> str:
    """The ranking as a plain-text table (what ``placement=auto`` prints and writes).

    Args:
        rows: the checked rows.
        winner: the winner (first row), or None.
        header: a line above the table (the profile's origin).
        top: rows printed; the others are counted in one line.

    Returns:
        The text.
    """
    shown = ordered(rows, winner)
    lines = [header] if header else []
    head = f"{'#':>3}  {'candidate':<52} {'pred s/step':>11}  {'peak mem':>10}  status"
    lines += [head, "-" * len(head)]
    for i, r in enumerate(shown[:top], 1):
        mark = "*" if r is winner else " "
        status = r.status if not r.reason else f"{r.status}: {r.reason}"
        lines.append(
            f"{i:>3}{mark} {r.candidate.name:<52} {r.seconds:>11.4f}  {_gib(r.peak_bytes):>10}  "
            f"{status}"
        )
    if len(shown) > top:
        more = shown[top:]
        counts = {s: sum(r.status == s for r in more) for s in (OK, EXCLUDED, UNCHECKED)}
        lines.append(
            f"... {len(more)} more ({', '.join(f'{n} {s}' for s, n in counts.items() if n)}; "
            f"all in auto_placement.json)"
        )
    if winner is not None:
        p = winner.prediction
        parts = ", ".join(f"{k} {v:.4f}" for k, v in p.parts.items())
        lines.append(f"* runs: {winner.candidate.name}: {p.formula} = {p.seconds:.4f} s ({parts})")
    return "\n".join(lines)
