"""``python -m rltrain --help``: what rltrain is, its config groups and modes, where to read more.

Hydra's stock page lists every group it knows, internal ones and private presets included, and
nothing of rltrain's modes or sub-commands. This page is built from the shipped ``conf/`` tree
and the config packages installed packages add under the ``rltrain.conf`` entry point group, so
a new preset or a user's placement appears in it without anyone editing the text; files whose
names start with ``_`` hold what presets share and are left out. ``--hydra-help`` still shows
Hydra's own page.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

#: Config groups a user chooses from, with what each chooses.
GROUPS = {
    "cluster": "a local Ray with simulated devices, or an existing Ray cluster",
    "placement": "which devices each component uses, and offload policies",
    "model": "the policy (built from a config, or model.path=/local/hf/checkpoint)",
    "task": "what the policy learns (task.name=jsonl task.path=... for your data)",
    "algorithm": "advantage estimator, policy loss, KL",
    "experiment": "presets that set several groups at once",
}


def group_options(config_path: str, extra_paths: Sequence[str] = ()) -> dict[str, list[str]]:
    """The public options of each config group.

    Args:
        config_path: the primary config's directory, or ``pkg://rltrain.conf``.
        extra_paths: further config paths (``pkg://mypkg.conf``) whose options are added.

    Returns:
        group -> its options (file names without ``.yaml``), private ones left out.
    """
    from hydra_plugins.rltrain_launcher.rltrain_search_path import local_dir

    roots = [r for r in (local_dir(p) for p in (config_path, *extra_paths)) if r is not None]
    out = {}
    for group in GROUPS:
        names: set[str] = set()
        for root in roots:
            folder = os.path.join(root, group)
            if os.path.isdir(folder):
                names.update(os.listdir(folder))
        out[group] = sorted(
            n[: -len(".yaml")] for n in names if n.endswith(".yaml") and not n.startswith("_")
        )
    return out


def help_text(config_path: str, prog: str = "python -m rltrain") -> str:
    """The help page.

    Args:
        config_path: where the shipped configs are (see :func:`group_options`).
        prog: how the program was started, for the examples.

    Returns:
        The page, ready to print.
    """
    defaults = {"cluster": "local", "placement": "collocated", "model": "tiny_llama"}
    defaults.update({"task": "arithmetic", "algorithm": "grpo"})
    lines = [
        f"usage: {prog} [group=option ...] [key=value ...]",
        f"       {prog} -m placement=collocated,disaggregated,hybrid [key=value ...]",
        f"       {prog} bench [name ...] | {prog} trace <run dir>",
        "",
        "rltrain trains LLM and embodied policies with RL on a Ray cluster; where each component",
        "(actor, rollout, reference, reward, critic, inference, env) runs is configuration.",
        "With no arguments it trains a tiny model on a local Ray with simulated devices.",
        "",
        "config groups (default first):",
    ]
    from hydra_plugins.rltrain_launcher.rltrain_search_path import contributed_config_paths

    for group, options in group_options(config_path, contributed_config_paths()).items():
        default = defaults.get(group)
        shown = sorted(options, key=lambda o: (o != default, o))
        lines.append(f"  {group:<10} {', '.join(shown) or '-'}")
        lines.append(f"  {'':<10} {GROUPS[group]}")
    lines += [
        "",
        "modes:",
        "  mode=train     (default) check everything, start Ray, train, write outputs",
        "  mode=plan      check everything training checks before Ray, print the placement",
        "                 plan and the predicted step (whatif.hardware=h100: on hardware you",
        "                 do not have), write plan.json, plan.svg, plan_trace.json; starts",
        "                 nothing and writes nothing else (task.generate's data not there yet:",
        "                 planned from the model fields, checked when a run writes it). With",
        "                 placement=auto it profiles short runs first: starts Ray, writes",
        "                 task.generate's data and the profile cache (placement.auto.cache_dir)",
        "",
        "sub-commands:",
        f"  {prog} bench --list            benchmark measures against same-run baselines",
        f"  {prog} trace <run dir>         draw a run's per-device timeline as a PNG",
        f"  {prog} trace <run> --predicted <plan dir>   the run beside its prediction",
        "",
        "everyday overrides:",
        f"  {prog} placement=hybrid trainer.total_steps=100",
        f"  {prog} placement.component_placement.actor=0-1      move a component",
        f"  {prog} cluster.devices_per_node=8 trainer.train_batch_size=16",
        f"  {prog} trainer.resume=auto                          continue the last run",
        f"  {prog} --cfg job                                    print the composed config",
        "",
        "more: README.md, docs/config.md (every key), docs/placement.md (the placement",
        "grammar), docs/gpu.md (GPU clusters). Hydra's own help: --hydra-help.",
    ]
    return "\n".join(lines)
