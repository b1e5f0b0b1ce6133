"""The channel actor's per-handle put order (``_ChannelActor``, run in-process on asyncio: the
ordering logic is the actor's own, Ray only carries its calls).

A put numbered ``n`` by a handle waits until the handle's earlier puts to the key are done; a
``put_nowait`` must still fail at once on a full queue, and a ``put(timeout=t)`` must give up
after ``t`` seconds, turn wait included, without holding up the handle's later puts.
"""

from __future__ import annotations

import asyncio
import pickle

from rltrain.scheduler.channel import _ChannelActor

KEY = "default"
LIMIT_S = 5.0  # far above what any of these calls may take: reaching it means it blocked


def item(value: str) -> bytes:
    return pickle.dumps(value)


async def take(actor: _ChannelActor) -> str:
    err, wrapped = await actor.get_batch(KEY, 0.5, 1, True, LIMIT_S)
    assert err is None
    return pickle.loads(wrapped[0])


def test_put_nowait_fails_at_once_while_an_earlier_put_waits_for_room():
    async def scenario() -> None:
        actor = _ChannelActor("c", maxsize=1)
        assert await actor.put(item("a"), KEY, 1.0, True, None, ("h", 0)) is None
        waiting = asyncio.create_task(actor.put(item("b"), KEY, 1.0, True, None, ("h", 1)))
        await asyncio.sleep(0)  # let it start waiting for room
        err = await asyncio.wait_for(actor.put(item("c"), KEY, 1.0, False, None, ("h", 2)), LIMIT_S)
        assert err is not None and err.startswith("full: ")
        assert await take(actor) == "a"
        assert await asyncio.wait_for(waiting, LIMIT_S) is None
        assert await take(actor) == "b"

    asyncio.run(scenario())


def test_a_timed_put_counts_its_turn_wait_and_later_puts_keep_their_order():
    async def scenario() -> None:
        actor = _ChannelActor("c", maxsize=1)
        loop = asyncio.get_running_loop()
        await actor.put(item("a"), KEY, 1.0, True, None, ("h", 0))
        waiting = asyncio.create_task(actor.put(item("b"), KEY, 1.0, True, None, ("h", 1)))
        await asyncio.sleep(0)
        began = loop.time()
        err = await asyncio.wait_for(actor.put(item("c"), KEY, 1.0, True, 0.2, ("h", 2)), LIMIT_S)
        assert err is not None and err.startswith("timeout: ")
        assert 0.2 <= loop.time() - began < 2.0
        # The given-up put 2 does not hold up put 3, which still goes after put 1.
        later = asyncio.create_task(actor.put(item("d"), KEY, 1.0, True, None, ("h", 3)))
        assert [await take(actor), await take(actor), await take(actor)] == ["a", "b", "d"]
        assert await waiting is None and await later is None

    asyncio.run(scenario())


def test_put_nowait_waits_for_an_earlier_put_still_arriving_when_there_is_room():
    async def scenario() -> None:
        actor = _ChannelActor("c", maxsize=2)
        # Put 1 arrives before put 0 (Ray runs an async actor's calls concurrently).
        second = asyncio.create_task(actor.put(item("y"), KEY, 1.0, False, None, ("h", 1)))
        await asyncio.sleep(0)
        assert not second.done()
        assert await actor.put(item("x"), KEY, 1.0, False, None, ("h", 0)) is None
        assert await asyncio.wait_for(second, LIMIT_S) is None
        assert [await take(actor), await take(actor)] == ["x", "y"]

    asyncio.run(scenario())
