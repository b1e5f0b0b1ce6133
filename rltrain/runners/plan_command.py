"""The ``plan`` command: ``python -m rltrain mode=plan [placement=...] [cluster...]``.

Prints the plan as a table, writes ``plan.json`` and ``plan.svg`` into the run directory, and
returns without starting Ray or importing torch. A plan that does not fit is still written (with
the over-full devices outlined in red), then refused with a :class:`ResourceError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from rltrain.errors import ConfigError
from rltrain.kinds import registry
from rltrain.placement.export import plan_to_dict
from rltrain.placement.plan import Plan, build_plan
from rltrain.placement.render import rows, size, svg, tool_pool_lines
from rltrain.placement.types import ClusterSpec


def run_dir() -> str:
    """Hydra's output directory for this job, or the working directory outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.output_dir
    except (ImportError, ValueError):
        return os.getcwd()


def plan_command(
    run: Any, out_dir: str | None = None, max_rows: int = 64, unsized: Any = None
) -> Plan:
    """Plan a run, show it, and write ``plan.json`` and ``plan.svg``.

    Args:
        run: the checked :class:`~rltrain.config.schema.RunConfig`.
        out_dir: where to write; None for the Hydra run directory.
        max_rows: table rows before consecutive alike processes are merged into one row.
        unsized: ``run`` before its null micro-batch sizes were chosen for its layout: the
            candidates the what-if ranks get theirs for their own layouts (None: ``run``'s).

    Returns:
        The plan.

    Raises:
        PlacementError: for a bad placement.
        ConfigError: a setting the what-if simulator does not model, before anything is
            written (:func:`rltrain.whatif.events.unmodelled`); every problem training would
            refuse before Ray starts (the plan not fitting, sizes, the dataset, the checkpoint
            to resume), after writing the plan.
    """
    from rltrain.whatif.events import unmodelled
    from rltrain.whatif.predict import planned_cluster

    problems = unmodelled(run)  # before anything is written: the prediction would be another's
    if problems:
        raise ConfigError(problems)
    out_dir = out_dir or run_dir()
    planned, note = _planned_run(run)
    os.makedirs(out_dir, exist_ok=True)
    plan = build_plan(planned, planned_cluster(run), check_fit=False)
    _print(plan, max_rows)
    if note:
        print(note)
    print(fusion_line(run, plan))
    _write(plan, out_dir, _predicted(run, planned, plan, out_dir, unsized))
    from rltrain.runners.layout import preflight

    layout = preflight(run, out_dir, plan)  # what training refuses before Ray, refused here
    if layout.resume_note:
        print(layout.resume_note)
    return plan


def _predicted(run: Any, planned: Any, plan: Plan, out_dir: str, unsized: Any) -> dict:
    """What the step simulator adds to ``plan.json`` (docs/whatif.md): the planned run's
    prediction and the candidates' ranking, each candidate sized from ``unsized``."""
    from rltrain.whatif.report import plan_prediction

    if unsized is not None and planned is not run:  # sized from the same model as the plan
        unsized = dataclasses.replace(unsized, model=planned.model)
    return plan_prediction(planned, plan, out_dir, _fusable, unsized, _refused)


def _refused(cand_run: Any) -> list[str]:
    """What training refuses of a ranked candidate's config before Ray starts: the config's
    checks on the layout as set by hand, then the task's (an environment's episodes are not
    continued across weight swaps), as ``placement=auto`` excludes a candidate
    (:func:`rltrain.autoplace.search.check_candidate`)."""
    from rltrain.config.validate import check_config
    from rltrain.tasks.text_env import env_problems
    from rltrain.whatif.candidates import as_set_by_hand

    by_hand = as_set_by_hand(cand_run)
    problems = check_config(by_hand)[1]
    if problems or not registry.runner(by_hand).language_model:
        return problems
    return env_problems(by_hand)


def _write(plan: Plan, out_dir: str, predicted: dict) -> None:
    """``plan.json`` (the plan and what the simulator predicted) and ``plan.svg``."""
    with open(os.path.join(out_dir, "plan.json"), "w") as f:
        json.dump({**plan_to_dict(plan), **predicted}, f, indent=1)
    with open(os.path.join(out_dir, "plan.svg"), "w") as f:
        f.write(svg(plan))
    print(f"wrote {os.path.join(out_dir, 'plan.json')} and plan.svg")


def _fusable(run: Any, plan: Plan) -> bool:
    """Whether the run's actor, rollout and reward run fused on this plan."""
    from rltrain.runners.fusion import fusion_blockers

    fuse = str(run.placement.fuse).lower()
    fusable = registry.runner(run).fusable
    return fusable and fuse != "false" and not fusion_blockers(run, plan)


def _planned_run(run: Any) -> tuple[Any, str]:
    """The run as planned, and a line when its model is not the one at ``model.path``.

    A run that only plans writes nothing, so ``task.generate``'s checkpoint may not exist yet:
    the plan is then sized from the model the generator will build from the ``model`` fields.
    """
    from rltrain.tasks import planning_model

    model = planning_model(run)
    if model is run.model:
        return run, ""
    note = (
        f"model: sized from the model fields (task.generate={run.task.generate!r} writes its "
        f"data and checkpoint to model.path={run.model.path!r} when the run starts; mode=plan "
        f"writes nothing, so the data set is checked then)"
    )
    return dataclasses.replace(run, model=model), note


def fusion_line(run: Any, plan: Plan) -> str:
    """One line on whether actor, rollout and reward run fused (``placement.fuse``)."""
    from rltrain.runners.fusion import fused_components, fusion_blockers

    mode = str(run.placement.fuse).lower()
    if mode == "false" or run.runner != "reasoning":
        return "processes: one per planned process (placement.fuse=false)"
    blockers = fusion_blockers(run, plan)
    if not blockers:
        return (
            f"processes: {'+'.join(fused_components())} fused, one process per actor rank "
            f"(placement.fuse={mode})"
        )
    return f"processes: not fused (placement.fuse={mode}): " + "; ".join(blockers)


def _print(plan: Plan, max_rows: int) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"{plan.mode.value} plan: {plan.cluster.num_nodes} node(s) x "
        f"{_per_node(plan.cluster)} device(s)"
    )
    table = Table(title=title, caption=f"peak memory over the stages {' -> '.join(plan.stages)}")
    for col in ("component", "rank", "node", "devices", "shared with", "peak memory"):
        table.add_column(col, justify="right" if col in ("rank", "node") else "left")
    for r in rows(plan, max_rows):
        table.add_row(r.component, r.ranks, r.nodes, r.devices, r.shared_with, r.memory)
    console = Console(width=max(int(os.environ.get("COLUMNS", 120)), 100))
    console.print(table)
    worlds = ", ".join(f"{c}={plan.world_size(c)}" for c in plan.components)
    console.print(f"world sizes: {worlds}")
    peak = max((m.peak_bytes for m in plan.memory.values()), default=0)
    console.print(f"highest predicted device peak: {size(peak)}")
    for line in tool_pool_lines(plan):
        console.print(line, highlight=False)


def _per_node(cluster: ClusterSpec) -> str:
    counts = sorted({n.num_devices for n in cluster.nodes})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
