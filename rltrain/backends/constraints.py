"""Plan-time rules the GPU engines impose on a placement, with messages that name the fix.

Pure (no torch, no Ray): the placement engine calls these while resolving a plan, so a layout
the engines cannot run is refused before any process starts.
"""

from __future__ import annotations

from collections.abc import Mapping

from rltrain.errors import ConfigError, PlacementError

GIB = 1024**3

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
    """Pick the weight sync path a placement allows.

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
