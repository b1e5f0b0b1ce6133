"""The Ray runtime: cluster, worker groups, reservations, collectives and channels.

Import-light: ``import rltrain.scheduler`` loads neither Ray nor torch; the names below load their
module on first use (so ``rltrain.scheduler.residency`` stays pure).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Cluster": "rltrain.scheduler.cluster",
    "Worker": "rltrain.scheduler.worker",
    "WorkerContext": "rltrain.scheduler.worker",
    "WorkerGroup": "rltrain.scheduler.group",
    "WorkerGroupBuilder": "rltrain.scheduler.group",
    "GroupFuture": "rltrain.scheduler.group",
    "WorkerInfo": "rltrain.scheduler.group",
    "CallTimeoutError": "rltrain.scheduler.group",
    "Reservation": "rltrain.scheduler.reservation",
    "ReservationLayout": "rltrain.scheduler.resources",
    "plan_reservation": "rltrain.scheduler.resources",
    "create_collective": "rltrain.scheduler.collective",
    "Channel": "rltrain.scheduler.channel",
    "ChannelStats": "rltrain.scheduler.channel",
    "ChannelFuture": "rltrain.scheduler.channel",
    "ChannelClosedError": "rltrain.scheduler.channel",
    "ChannelFullError": "rltrain.scheduler.channel",
    "ChannelEmptyError": "rltrain.scheduler.channel",
    "ChannelTimeoutError": "rltrain.scheduler.channel",
}

__all__ = [
    "CallTimeoutError",
    "Channel",
    "ChannelClosedError",
    "ChannelEmptyError",
    "ChannelFullError",
    "ChannelFuture",
    "ChannelStats",
    "ChannelTimeoutError",
    "Cluster",
    "GroupFuture",
    "Reservation",
    "ReservationLayout",
    "Worker",
    "WorkerContext",
    "WorkerGroup",
    "WorkerGroupBuilder",
    "WorkerInfo",
    "create_collective",
    "plan_reservation",
]

if TYPE_CHECKING:
    from rltrain.scheduler.channel import (
        Channel,
        ChannelClosedError,
        ChannelEmptyError,
        ChannelFullError,
        ChannelFuture,
        ChannelStats,
        ChannelTimeoutError,
    )
    from rltrain.scheduler.cluster import Cluster
    from rltrain.scheduler.collective import create_collective
    from rltrain.scheduler.group import (
        CallTimeoutError,
        GroupFuture,
        WorkerGroup,
        WorkerGroupBuilder,
        WorkerInfo,
    )
    from rltrain.scheduler.reservation import Reservation
    from rltrain.scheduler.resources import ReservationLayout, plan_reservation
    from rltrain.scheduler.worker import Worker, WorkerContext


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rltrain.scheduler' has no attribute {name!r}")
