"""A plan as JSON-serialisable data (``plan.json``).

Devices with the same load share one memory record in the plan; the JSON keeps that factoring:
``memory_profiles`` lists each distinct record once and every device names its profile, so a
1,024-node plan stays a few megabytes while remaining exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rltrain.placement.plan import DeviceMemory, Plan


def _profile(dm: DeviceMemory) -> dict[str, Any]:
    return {
        "capacity_bytes": dm.capacity_bytes,
        "accelerator_type": dm.accelerator_type,
        "peak_bytes": dm.peak_bytes,
        "required_bytes": dm.required_bytes,
        "stages": [
            {
                "stage": s.stage,
                "required_bytes": s.required_bytes,
                "peak_bytes": s.peak_bytes,
                "terms": [dataclasses.asdict(t) for t in s.terms],
            }
            for s in dm.stages
        ],
    }


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Everything in the plan as plain lists, dicts, strings and numbers.

    Args:
        plan: the plan.

    Returns:
        ``{mode, runner, stages, cluster, components, processes, devices, memory_profiles,
        weight_sync, tools, fits, problems}`` (``tools``: the tool pool's sizes per node, or
        None).
    """
    profiles: dict[int, int] = {}
    profile_list: list[dict[str, Any]] = []
    devices = []
    for (node, dev), comps in plan.sharing.items():
        dm = plan.memory[(node, dev)]
        if id(dm) not in profiles:
            profiles[id(dm)] = len(profile_list)
            profile_list.append(_profile(dm))
        devices.append(
            {
                "node": node,
                "device": dev,
                "components": list(comps),
                "memory_profile": profiles[id(dm)],
            }
        )
    problems = plan.fit_problems()
    pool_problems = plan.tools.problems() if plan.tools is not None else []
    return {
        "mode": plan.mode.value,
        "runner": plan.runner,
        "stages": list(plan.stages),
        "cluster": {
            "num_nodes": plan.cluster.num_nodes,
            "num_devices": plan.cluster.num_devices,
            "devices_per_node": [n.num_devices for n in plan.cluster.nodes],
            "device_memory_bytes": [n.device_memory_bytes for n in plan.cluster.nodes],
            "node_groups": [dataclasses.asdict(g) for g in plan.cluster.node_groups],
        },
        "components": [{"name": c, "world_size": plan.world_size(c)} for c in plan.components],
        "processes": [
            {
                "component": p.component,
                "rank": p.rank,
                "node": p.node_rank,
                "devices": list(p.devices),
                "placement": dataclasses.asdict(p.placement),
            }
            for p in plan.processes
        ],
        "devices": devices,
        "memory_profiles": profile_list,
        "weight_sync": {str(a): list(r) for a, r in plan.weight_sync.items()},
        "tools": dataclasses.asdict(plan.tools) if plan.tools is not None else None,
        "fits": not problems and not plan.engine_problems and not pool_problems,
        "problems": [p.message() for p in problems] + list(plan.engine_problems) + pool_problems,
    }
