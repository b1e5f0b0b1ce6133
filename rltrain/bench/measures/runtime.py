"""Runtime measures: group calls, channels and start-up, each against raw Ray in the same run.

- ``runtime_call``: a no-op call to a one-actor group (``group.call(W.noop).wait()``) vs a raw Ray
  actor call (``ray.get(actor.noop.remote())``); goal <= 1.2x.
- ``channel_1mb`` / ``channel_16mb`` / ``channel_64mb``: one item through a channel (``put`` then
  ``get``, same process) vs raw ``ray.put`` + ``ray.get``; goal >= 0.9x throughput, i.e. a time
  ratio <= 1.11. Cases with a producer actor feeding the driver show the pipelined rate: with
  blocking ``put``/``get``, and streamed (``start_put`` with up to ``maxsize`` puts in flight,
  ``start_get`` asking for the next item ahead).
- ``channel_1kb``: 256 items of 1 KB: ``put_batch`` + ``get_batch`` and per-item ``put``/``get``
  vs raw put+get per item.
- ``runtime_startup``: launching N workers that import torch, and N bare workers, vs N bare Ray
  actors.

All share one local Ray (started on first use, simulated devices, stopped at exit).
"""

from __future__ import annotations

from typing import Any

from rltrain.bench.harness import Case, Suite, measure
from rltrain.scheduler.worker import Worker  # import-light: no Ray, no torch

_STATE: dict[str, Any] = {}


def _cluster() -> Any:
    """The measures' shared local cluster (2 simulated devices, this machine's cores)."""
    if "cluster" not in _STATE:
        import os

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        from rltrain.placement.strategies import NodePlacementStrategy
        from rltrain.scheduler import Cluster

        cluster = Cluster.start({"devices_per_node": 2, "startup_timeout_s": 120})
        node = NodePlacementStrategy([0]).get_placement(cluster.spec)
        # One reservation for every measure's groups, as a trainer reserves for its whole plan
        # (a node-only group reserving alone takes one device's worth of the node's cores).
        _STATE["reservation"] = cluster.reserve(
            {
                "bench_call": node,
                "bench_producer": node,
                "bench_startup": NodePlacementStrategy([0] * 4).get_placement(cluster.spec),
            }
        )
        _STATE["cluster"] = cluster
    return _STATE["cluster"]


def _end() -> None:
    """A measure's teardown: its groups and the shared reservation go, and the Ray it started
    stops (a joined Ray, ``--address``, stays). Held past the measure, the reservation's cores
    would keep the next measure of the same bench process waiting for them."""
    cluster = _STATE.pop("cluster", None)
    _STATE.clear()
    if cluster is not None:
        cluster.shutdown()


def _launch(cls: type, name: str, n: int = 1) -> Any:
    from rltrain.placement.strategies import NodePlacementStrategy

    return cls.create_group().launch(
        _cluster(),
        name=name,
        placement_strategy=NodePlacementStrategy([0] * n),
        reservation=_STATE["reservation"],
    )


class NoopWorker(Worker):
    """Does nothing: measures the runtime's own cost."""

    def noop(self) -> None:
        return None


class TorchWorker(Worker):
    """Imports torch and builds a tiny module, as a trainer worker would."""

    def __init__(self) -> None:
        import torch

        self.model = torch.nn.Linear(8, 8)

    def noop(self) -> None:
        return None


class ProducerWorker(Worker):
    """Puts ``n`` copies of an array of ``nbytes`` into a channel."""

    def produce(self, channel: Any, nbytes: int, n: int) -> int:
        import numpy as np

        item = np.ones(nbytes, dtype=np.uint8)
        for _ in range(n):
            channel.put(item)
        return n

    def stream(self, channel: Any, nbytes: int, n: int) -> int:
        """Like :meth:`produce`, but keeps up to ``channel.maxsize`` puts in flight
        (``start_put``) instead of waiting for each one's answer; the channel's bound holds."""
        import numpy as np

        item = np.ones(nbytes, dtype=np.uint8)
        window: list[Any] = []
        for _ in range(n):
            if len(window) >= channel.maxsize:
                window.pop(0).result()
            window.append(channel.start_put(item))
        for f in window:
            f.result()
        return n


@measure("runtime_call", "no-op call: one-actor WorkerGroup vs raw Ray actor call (goal <= 1.2x)")
def runtime_call(quick: bool) -> Suite:
    import ray

    group = _launch(NoopWorker, "bench_call")
    raw = ray.remote(NoopWorker).options(num_cpus=0).remote()
    ray.get(raw.noop.remote())
    calls = 100 if quick else 500

    def raw_calls() -> None:
        for _ in range(calls):
            ray.get(raw.noop.remote())

    def typed_calls() -> None:
        for _ in range(calls):
            group.call(NoopWorker.noop).wait()

    return Suite(
        teardown=_end,
        cases=(
            Case("raw ray actor call", raw_calls, work=calls, work_unit="calls"),
            Case("group.call(NoopWorker.noop).wait()", typed_calls, work=calls, work_unit="calls"),
        ),
        baseline="raw ray actor call",
        repeats=7,
        note=f"{calls} sequential calls per sample",
    )


def _channel_suite(nbytes: int, count: int, label: str) -> Suite:
    import numpy as np
    import ray

    from rltrain.scheduler import Channel

    cluster = _cluster()
    item = np.ones(nbytes, dtype=np.uint8)
    channel = Channel.create(f"bench_{label}", maxsize=4, cluster=cluster)
    if "producer" not in _STATE:
        _STATE["producer"] = _launch(ProducerWorker, "bench_producer")
    producer = _STATE["producer"]

    def raw() -> None:
        for _ in range(count):
            out = ray.get(ray.put(item))
            del out

    def through_channel() -> None:
        for _ in range(count):
            channel.put(item)
            out = channel.get()
            del out

    distinct = [np.full(nbytes, i, dtype=np.uint8) for i in range(4)]  # not one object 4 times

    def batched() -> None:
        for start in range(0, count, 4):  # maxsize=4: batches of up to 4 items
            n = min(4, count - start)
            channel.put_batch(distinct[:n])
            out = channel.get_batch(target_weight=n)
            del out

    def pipelined() -> None:
        done = producer.call(ProducerWorker.produce, channel, nbytes, count)
        for _ in range(count):
            out = channel.get()
            del out
        done.wait()

    def streamed() -> None:
        done = producer.call(ProducerWorker.stream, channel, nbytes, count)
        pending = channel.start_get()
        for i in range(count):
            out = pending.result()
            if i + 1 < count:  # ask for the next item while this one is used
                pending = channel.start_get()
            del out
        done.wait()

    work = nbytes * count
    return Suite(
        teardown=_end,
        cases=(
            Case("raw ray.put + ray.get", raw, work=work, work_unit="bytes"),
            Case("channel put + get", through_channel, work=work, work_unit="bytes"),
            Case("channel put_batch + get_batch (4)", batched, work=work, work_unit="bytes"),
            Case("channel, producer actor -> driver", pipelined, work=work, work_unit="bytes"),
            Case(
                "channel, producer actor -> driver, streamed",
                streamed,
                work=work,
                work_unit="bytes",
            ),
        ),
        baseline="raw ray.put + ray.get",
        repeats=3,
        note=f"{count} items of {nbytes / 2**20:g} MiB per sample; numpy uint8 arrays",
    )


@measure(
    "channel_1mb", "1 MiB items: channel put+get vs raw ray.put+ray.get (goal: time ratio <= 1.11x)"
)
def channel_1mb(quick: bool) -> Suite:
    return _channel_suite(2**20, 16 if quick else 64, "1mb")


@measure(
    "channel_16mb",
    "16 MiB items: channel put+get vs raw ray.put+ray.get (goal: time ratio <= 1.11x)",
)
def channel_16mb(quick: bool) -> Suite:
    return _channel_suite(16 * 2**20, 4 if quick else 16, "16mb")


@measure(
    "channel_64mb",
    "64 MiB items: channel put+get vs raw ray.put+ray.get (goal: time ratio <= 1.11x)",
)
def channel_64mb(quick: bool) -> Suite:
    return _channel_suite(64 * 2**20, 2 if quick else 8, "64mb")


@measure("channel_1kb", "1 KB items: channel put_batch+get_batch vs raw put+get per item")
def channel_1kb(quick: bool) -> Suite:
    import ray

    from rltrain.scheduler import Channel

    cluster = _cluster()
    count = 64 if quick else 256
    items = [bytes(1024) for _ in range(count)]
    channel = Channel.create("bench_1kb", maxsize=count, cluster=cluster)

    def raw() -> None:
        for x in items:
            ray.get(ray.put(x))

    def batched() -> None:
        channel.put_batch(items)
        got = channel.get_batch(target_weight=count)
        assert len(got) == count  # noqa: S101 - a benchmark sanity check

    def per_item() -> None:
        for x in items:
            channel.put(x)
            channel.get()

    work = count * 1024
    return Suite(
        teardown=_end,
        cases=(
            Case("raw ray.put + ray.get per item", raw, work=work, work_unit="bytes"),
            Case("channel put_batch + get_batch", batched, work=work, work_unit="bytes"),
            Case("channel put + get per item", per_item, work=work, work_unit="bytes"),
        ),
        baseline="raw ray.put + ray.get per item",
        repeats=3,
        note=f"{count} items of 1 KiB per sample",
    )


@measure("runtime_startup", "launch N torch workers / N bare workers vs N bare Ray actors")
def runtime_startup(quick: bool) -> Suite:
    import ray

    _cluster()
    n = 1 if quick else 4  # --quick checks the path: one process of each kind

    def bare_actors() -> None:
        actors = [ray.remote(NoopWorker).options(num_cpus=0).remote() for _ in range(n)]
        ray.get([a.noop.remote() for a in actors])
        for a in actors:
            ray.kill(a)

    def launch(cls: type) -> Any:
        def run() -> None:
            _launch(cls, "bench_startup", n).shutdown()

        return run

    return Suite(
        teardown=_end,
        cases=(
            Case(f"{n} bare Ray actors", bare_actors, size=n),
            Case(f"{n} bare workers (group)", launch(NoopWorker), size=n),
            Case(f"{n} torch workers (group)", launch(TorchWorker), size=n),
        ),
        baseline=f"{n} bare Ray actors",
        warmup=0 if quick else 1,  # --quick checks the path: the timed call is the first
        repeats=3,
        note="each sample starts and stops the processes; start-up is serialised on 2 cores",
    )
