"""Channels: bounded FIFOs with backpressure, per-key queues, batches, close, flat memory."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

import numpy as np
import psutil
import pytest

from rltrain.errors import ResourceError
from rltrain.placement.strategies import NodePlacementStrategy
from rltrain.scheduler import (
    Channel,
    ChannelClosedError,
    ChannelEmptyError,
    ChannelFullError,
    ChannelTimeoutError,
    Worker,
)

pytestmark = pytest.mark.timeout(180)


class Producer(Worker):
    def produce(self, channel: Channel, n: int) -> int:
        for i in range(n):
            channel.put({"i": i, "payload": bytes(1000)})
        return n


def slow_consume(item: dict) -> int:
    # Well over 10x the producer's per-item cost (~1-2 ms): hash 8 MB.
    return int(hashlib.sha256(item["payload"] * 8000).hexdigest()[:4], 16)


def test_fast_producer_never_gets_more_than_maxsize_ahead(cluster):
    channel = Channel.create("rollouts", maxsize=4, cluster=cluster)
    producer = Producer.create_group().launch(
        cluster, name="producer", placement_strategy=NodePlacementStrategy([0])
    )
    done = producer.call(Producer.produce, channel, 40)
    # Wait (on the channel's own count, with a deadline) until the producer has filled it.
    deadline = time.monotonic() + 60
    while channel.qsize() < 4:
        assert time.monotonic() < deadline, "the producer never filled the channel"
    assert not done.done()  # blocked in put: 36 items still to go
    got = []
    for _ in range(40):
        assert channel.qsize() <= 4
        item = channel.get(timeout=30)
        slow_consume(item)
        got.append(item["i"])
    assert done.wait(timeout=30) == [40]
    stats = channel.stats()
    assert got == list(range(40))  # FIFO
    assert stats.high_water["default"] == 4  # the producer filled the channel, and no more
    assert (stats.puts, stats.gets, stats.sizes["default"]) == (40, 40, 0)


def test_nowait_forms_keys_batches_and_timeouts(cluster):
    channel = Channel.create("small", maxsize=2, cluster=cluster)
    channel.put_nowait("a", weight=2.0)
    channel.put_nowait("b", weight=3.0)
    with pytest.raises(ChannelFullError, match="holds 2 items"):
        channel.put_nowait("c")
    with pytest.raises(ChannelTimeoutError):
        channel.put("c", timeout=0.2)
    channel.put("x", key="other")  # a separate sub-queue with its own bound
    assert channel.get(key="other") == "x"
    with pytest.raises(ChannelEmptyError):
        channel.get_nowait(key="other")
    assert channel.get_batch(target_weight=5.0) == ["a", "b"]
    channel.put("d", weight=1.0)
    # Below target after the timeout: returns what it has.
    assert channel.get_batch(target_weight=10.0, timeout=0.2) == ["d"]
    assert Channel.connect("small").maxsize == 2
    with pytest.raises(ResourceError, match="'small' already exists"):
        Channel.create("small", maxsize=2)


def test_async_forms(cluster):
    channel = Channel.create("async", maxsize=3, cluster=cluster)

    async def roundtrip() -> tuple:
        await channel.async_put(1)
        await channel.async_put(2, weight=2.0)
        first = await channel.async_get()
        rest = await channel.async_get_batch(target_weight=2.0)
        return first, rest

    assert asyncio.run(roundtrip()) == (1, [2])
    channel.put_batch(["x", "y", "z"], weight=0.5)
    assert channel.get_batch(target_weight=1.0) == ["x", "y"]
    assert channel.get() == "z"


def test_close_wakes_blocked_callers(cluster):
    channel = Channel.create("closing", maxsize=1, cluster=cluster)
    errors: list[BaseException] = []
    started = threading.Event()

    def blocked_get() -> None:
        started.set()
        try:
            channel.get(timeout=60)
        except BaseException as exc:  # recorded for the assertion below
            errors.append(exc)

    t = threading.Thread(target=blocked_get)
    t.start()
    started.wait(10)
    channel.close()
    t.join(30)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ChannelClosedError)
    assert "'closing' was closed" in str(errors[0])
    with pytest.raises(ChannelClosedError):
        channel.put("late")


def test_channel_memory_stays_flat_with_64mb_items(cluster):
    channel = Channel.create("big", maxsize=2, cluster=cluster)
    item = np.ones(64 * 1024 * 1024, dtype=np.uint8)
    proc = psutil.Process(channel.stats().pid)
    before = proc.memory_info().rss
    for _ in range(6):
        channel.put(item)
        out = channel.get(timeout=30)
        assert out.nbytes == item.nbytes and out[0] == 1
        del out
    grew = proc.memory_info().rss - before
    # 384 MB went through; the channel actor holds only references.
    assert grew < 32 * 1024 * 1024, grew


def test_small_items_go_by_value_and_batches_share_one_object(cluster):
    channel = Channel.create("inline", maxsize=4, cluster=cluster, inline_bytes=1024)
    small, large = np.arange(8, dtype=np.float32), np.arange(4096, dtype=np.int32)  # 32 B, 16 KiB
    channel.put(small)
    channel.put(large)
    assert channel.stats().by_value == 1  # only the small one travelled by value
    got_small, got_large = channel.get(), channel.get()
    assert np.array_equal(got_small, small) and np.array_equal(got_large, large)
    # A batch mixing both: the large items share one object, each keeps its place and order.
    batch = [large, small, large + 1, {"k": 2}]
    channel.put_batch(batch)
    assert channel.stats().by_value == 3
    out = channel.get_batch(target_weight=4)
    assert [type(x) for x in out] == [np.ndarray, np.ndarray, np.ndarray, dict]
    assert all(np.array_equal(a, b) for a, b in zip(out[:3], batch[:3], strict=True))
    assert out[3] == {"k": 2}
    # inline_bytes=0: everything through the object store, same results
    by_ref = Channel.create("by-ref", maxsize=2, cluster=cluster, inline_bytes=0)
    by_ref.put_batch([small, small * 2])
    assert [x.tolist() for x in by_ref.get_batch(2)] == [small.tolist(), (small * 2).tolist()]
    assert by_ref.stats().by_value == 0
    with pytest.raises(ResourceError, match="inline_bytes=-1 must be >= 0"):
        Channel.create("bad-inline", maxsize=2, inline_bytes=-1)


def test_started_puts_and_gets_complete_later_and_keep_the_bound(cluster):
    channel = Channel.create("started", maxsize=1, cluster=cluster)
    pending = channel.start_get(key="k", timeout=30)
    assert not pending.done()  # nothing queued yet: the get waits in the channel
    first = channel.start_put("a", key="k")
    assert pending.result(timeout=30) == "a"
    first.result(timeout=30)
    channel.put("b", key="k")
    blocked = channel.start_put("c", key="k", timeout=30)  # the key's queue is full
    with pytest.raises(ChannelTimeoutError, match="not answered within 0.2 s"):
        blocked.result(timeout=0.2)
    assert channel.qsize("k") == 1
    assert channel.get(key="k") == "b"
    blocked.result(timeout=30)  # room again: accepted
    assert channel.get(key="k") == "c"
    # Started puts keep their order, though the channel actor runs its calls concurrently.
    started = [channel.start_put(x, key="ordered") for x in "pqrs"]
    assert [channel.get(key="ordered", timeout=30) for _ in "pqrs"] == list("pqrs")
    for f in started:
        f.result(timeout=30)
    channel.start_put("d", key="k").result(timeout=30)
    channel.close()
    assert channel.get(key="k") == "d"  # queued before the close: still taken
    with pytest.raises(ChannelClosedError):
        channel.start_put("e", key="k").result(timeout=30)
