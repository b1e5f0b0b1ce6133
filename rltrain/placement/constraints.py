"""Plan-time rules the GPU engines impose on a placement, with messages that name the fix.

Pure (no torch, no Ray): :func:`rltrain.placement.plan.build_plan` calls
:func:`check_nccl_group_devices` (on CUDA devices) and :func:`check_weight_sync_layout` while
resolving a plan, so ``mode=plan`` refuses a layout the engines cannot run, before any process
starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rltrain.errors import ConfigError, PlacementError
from rltrain.placement.types import GIB

#: Weight sync paths: object store/gloo (CPU), CUDA IPC (collocated), NCCL (disaggregated).
SYNC_PATHS = ("host", "ipc", "nccl")


def check_hybrid_engine_shape(actor_gpus: int, rollout_gpus: int, rollout_tp: int) -> int:
    """OpenRLHF's hybrid-engine rule: collocated actor GPUs = rollout engines x TP.

    Args:
        actor_gpus: GPUs the actor's processes use (one per process).
        rollout_gpus: GPUs the rollout uses (the same GPUs when collocated).
        rollout_tp: ``rollout.tensor_parallel_size``.

    Returns:
        The number of rollout engines (``rollout_gpus // rollout_tp``).

    Raises:
        ConfigError: when TP does not divide the rollout GPUs, or the counts differ.
    """
    if rollout_tp < 1:
        raise ConfigError(f"rollout.tensor_parallel_size={rollout_tp} must be at least 1")
    if rollout_gpus % rollout_tp:
        raise ConfigError(
            f"rollout.tensor_parallel_size={rollout_tp} does not divide the {rollout_gpus} GPUs "
            f"placed for the rollout: each engine needs exactly {rollout_tp} GPUs; change the "
            f"rollout placement or the TP size"
        )
    engines = rollout_gpus // rollout_tp
    if actor_gpus != rollout_gpus:
        raise ConfigError(
            f"collocated actor and rollout must use the same GPUs: actor has {actor_gpus}, "
            f"rollout has {engines} engines x TP {rollout_tp} = {rollout_gpus}; place both on "
            f"the same devices (e.g. placement.component_placement='actor,rollout': all)"
        )
    return engines


def check_rollout_memory(
    gpu_memory_utilization: float,
    device_bytes: int,
    weights_bytes_per_gpu: int,
    coresident_bytes: int = 0,
    device: str = "device 0",
) -> int:
    """Check a vLLM engine's reservation against the plan's memory for one GPU.

    vLLM reserves ``gpu_memory_utilization x capacity`` for its weights and KV cache. That must
    hold the engine's weights with room left for a KV cache, and, with whatever other
    components keep resident on the same GPU while it generates, fit the device.

    Args:
        gpu_memory_utilization: ``rollout.gpu_memory_utilization``.
        device_bytes: the GPU's capacity.
        weights_bytes_per_gpu: the rollout's weights on this GPU (model bytes / TP).
        coresident_bytes: bytes other components keep on this GPU during generation (state
            their offload policies do not move).
        device: the device's name for messages (``node 0 device 3``).

    Returns:
        Bytes left for the KV cache.

    Raises:
        ConfigError: when the reservation cannot hold the weights or does not fit beside the
            co-resident state.
    """
    reserved = int(gpu_memory_utilization * device_bytes)
    if reserved <= weights_bytes_per_gpu:
        raise ConfigError(
            f"rollout.gpu_memory_utilization={gpu_memory_utilization} reserves "
            f"{reserved / GIB:.1f} GiB on {device}, not more than the rollout's weights "
            f"({weights_bytes_per_gpu / GIB:.1f} GiB): raise it, or raise "
            f"rollout.tensor_parallel_size"
        )
    if reserved + coresident_bytes > device_bytes:
        raise ConfigError(
            f"on {device} the rollout reserves {reserved / GIB:.1f} GiB "
            f"(rollout.gpu_memory_utilization={gpu_memory_utilization}) while other components "
            f"keep {coresident_bytes / GIB:.1f} GiB there, over the capacity of "
            f"{device_bytes / GIB:.1f} GiB: lower rollout.gpu_memory_utilization or offload more "
            f"(placement.offload.<component>)"
        )
    return reserved - weights_bytes_per_gpu


def collocated_rank_map(
    actor_devices: Mapping[int, tuple[int, int]], rollout_devices: Mapping[int, tuple[int, int]]
) -> dict[int, int]:
    """For each rollout rank, the actor rank on the same GPU (who it takes weights from by IPC).

    Args:
        actor_devices: actor rank -> ``(node rank, local device id)`` (one device per rank).
        rollout_devices: rollout rank -> ``(node rank, local device id)``; a tensor-parallel
            engine contributes one rank per shard.

    Returns:
        rollout rank -> actor rank.

    Raises:
        PlacementError: when a rollout rank's GPU holds no actor rank, or holds two.
    """
    by_device: dict[tuple[int, int], int] = {}
    for rank, dev in sorted(actor_devices.items()):
        if dev in by_device:
            raise PlacementError(
                f"actor ranks {by_device[dev]} and {rank} share GPU {dev}; CUDA IPC weight sync "
                f"needs one actor rank per GPU"
            )
        by_device[dev] = rank
    out = {}
    for rank, dev in sorted(rollout_devices.items()):
        if dev not in by_device:
            raise PlacementError(
                f"rollout rank {rank} is on node {dev[0]} device {dev[1]}, where no actor rank "
                f"runs: CUDA IPC weight sync needs actor and rollout collocated on every rollout "
                f"GPU (place them together, or use a disaggregated placement with NCCL sync)"
            )
        out[rank] = by_device[dev]
    return out


def choose_sync_path(
    accelerator_type: str,
    actor_devices: Mapping[int, tuple[int, int]],
    rollout_devices: Mapping[int, tuple[int, int]],
) -> str:
    """Pick the weight sync path a placement allows, without a configured transport.

    This is the layout's own answer (IPC or NCCL only); ``weight_sync.transport`` adds the
    object store and collectives that serve partial overlaps too
    (:mod:`rltrain.placement.transport_choice`), and planning checks the configured transport
    with :func:`check_weight_sync_layout`.

    Args:
        accelerator_type: ``cuda``, ``sim`` or ``none``.
        actor_devices: actor rank -> ``(node, device)``.
        rollout_devices: rollout rank -> ``(node, device)``.

    Returns:
        ``host`` off CUDA; ``ipc`` when every rollout GPU holds an actor rank; ``nccl`` when
        actor and rollout GPUs are disjoint.

    Raises:
        PlacementError: when they overlap only partly (NCCL cannot put two ranks of one
            group on a GPU, IPC cannot reach the GPUs without an actor rank).
    """
    if accelerator_type != "cuda":
        return "host"
    actor = set(actor_devices.values())
    rollout = set(rollout_devices.values())
    if rollout <= actor:
        return "ipc"
    if not rollout & actor:
        return "nccl"
    raise PlacementError(
        f"actor GPUs {sorted(actor)} and rollout GPUs {sorted(rollout)} overlap only partly: "
        f"weight sync needs them either collocated on every rollout GPU (CUDA IPC) or fully "
        f"disjoint (NCCL); change placement.component_placement"
    )


#: Components whose ranks form one NCCL process group on GPUs (their data-parallel group).
NCCL_GROUP_COMPONENTS = ("actor", "critic", "inference")

Device = tuple[int, int]


def check_nccl_group_devices(
    component: str, rank_devices: Mapping[int, Sequence[Device]], where: str = ""
) -> None:
    """Refuse two ranks of one NCCL process group on one GPU.

    NCCL builds one communicator per GPU: a second rank of the same group on that GPU makes
    ``init_process_group`` fail ("Duplicate GPU detected"), so a layout that shares a GPU
    between a component's own ranks cannot run on real GPUs.

    Args:
        component: the component whose ranks form the group (``actor``, ``critic``, ...).
        rank_devices: rank -> the ``(node, device)`` pairs it uses.
        where: the config key and value the layout came from, for the message.

    Raises:
        PlacementError: naming the ranks, the GPU and the fix.
    """
    seen: dict[Device, int] = {}
    for rank in sorted(rank_devices):
        for dev in rank_devices[rank]:
            if dev in seen:
                src = f"{where}: " if where else ""
                raise PlacementError(
                    f"{src}{component} ranks {seen[dev]} and {rank} share GPU {dev[1]} of node "
                    f"{dev[0]}, but the {component}'s ranks form one NCCL process group, and "
                    f"NCCL cannot run two ranks of a group on one GPU: give each {component} "
                    f"rank its own GPU (one process per device, e.g. "
                    f"placement.component_placement.{component}=0-3 rather than 0-1:0-3), or "
                    f"plan on simulated devices (cluster.simulate_devices=true)"
                )
            seen[dev] = rank


def check_weight_sync_layout(
    transport: str,
    actor_devices: Mapping[int, Sequence[Device]],
    rollout_devices: Mapping[int, Sequence[Device]],
) -> None:
    """Refuse a ``weight_sync.transport`` the actor/rollout layout cannot serve.

    ``ipc`` hands each rollout process CUDA IPC handles of the actor ranks on its own GPUs, so
    every GPU of every rollout process must host an actor rank. ``host`` (the object store),
    ``collective`` and ``auto`` (which picks one the layout allows) serve any layout.

    Args:
        transport: ``weight_sync.transport``.
        actor_devices: actor rank -> its ``(node, device)`` pairs.
        rollout_devices: rollout rank -> its ``(node, device)`` pairs.

    Raises:
        ConfigError: ``ipc`` with a rollout GPU that hosts no actor rank (a config key at odds
            with the placement, as :func:`rltrain.placement.transport_choice.choose_transport`
            reports it).
    """
    if transport != "ipc":
        return
    actor = {d for devs in actor_devices.values() for d in devs}
    for rank in sorted(rollout_devices):
        bare = [d for d in rollout_devices[rank] if d not in actor]
        if bare:
            node, dev = bare[0]
            raise ConfigError(
                f"weight_sync.transport=ipc needs an actor rank on every GPU of every rollout "
                f"process, but rollout rank {rank} uses device {dev} of node {node}, where no "
                f"actor rank runs (actor devices {_brief(sorted(actor))}): place the rollout on "
                f"the actor's devices, or use weight_sync.transport=host, collective or auto"
            )


def _brief(devices: list[Device], limit: int = 6) -> str:
    text = ", ".join(f"{n}:{d}" for n, d in devices[:limit])
    return f"[{text}{', ...' if len(devices) > limit else ''}]"
