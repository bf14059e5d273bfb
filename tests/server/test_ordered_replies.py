"""A stream's waits (``OrderedReplies``): the writer's for an answer, the reader's for room under the
in-flight limit, a wait for the stream to drain. Each is a future made only while somebody waits; these
tests hold what the stream loop relies on: no wake-up lost, none given early, and a wait cancelled with
its call never breaks whoever answers later (the core's callback answers many streams in one pass)."""

from __future__ import annotations

import asyncio

from aaren.server.frontends.streams import OrderedReplies, _Place


def place(stream: OrderedReplies, name: str) -> _Place:
    return _Place(name, 0.0, stream)


def test_the_writer_wakes_when_the_oldest_is_answered_not_a_later_one():
    async def main() -> list[str]:
        stream: OrderedReplies = OrderedReplies(limit=8)
        first, second = place(stream, "a"), place(stream, "b")
        stream.add(first)
        stream.add(second)
        seen: list[str] = []
        loop = asyncio.get_running_loop()

        async def writer() -> None:
            while len(seen) < 2:
                oldest = stream.pending[0]
                if not oldest.answered:
                    stream.writer = news = loop.create_future()
                    await news
                    continue
                seen.append(oldest.request)
                stream.sent()

        task = asyncio.create_task(writer())
        await asyncio.sleep(0)
        news = stream.writer
        assert news is not None and not task.done()
        second(None)  # a later request answered first: the writer is not woken for it
        await asyncio.sleep(0)
        assert stream.writer is news and not news.done() and seen == []
        first(None)
        await asyncio.wait_for(task, 1)
        return seen

    assert asyncio.run(main()) == ["a", "b"]


def test_the_reader_waits_for_room_at_the_limit_and_resumes_when_a_reply_leaves():
    async def main() -> None:
        stream: OrderedReplies = OrderedReplies(limit=2)
        stream.add(place(stream, "a"))
        stream.add(place(stream, "b"))
        reader = asyncio.create_task(stream.room())
        await asyncio.sleep(0)
        assert not reader.done()  # two unanswered of two
        stream.pending[0](None)
        stream.sent()
        await asyncio.wait_for(reader, 1)
        # below the limit: no wait at all
        await asyncio.wait_for(stream.room(), 1)

    asyncio.run(main())


def test_idle_waits_until_nothing_is_unanswered():
    async def main() -> None:
        stream: OrderedReplies = OrderedReplies(limit=8)
        await asyncio.wait_for(stream.idle(), 1)  # nothing pending: at once
        stream.add(place(stream, "a"))
        stream.add(place(stream, "b"))
        idle = asyncio.create_task(stream.idle())
        stream.sent()
        await asyncio.sleep(0)
        assert not idle.done()  # one still unanswered
        stream.sent()
        await asyncio.wait_for(idle, 1)

    asyncio.run(main())


def test_a_wait_cancelled_with_its_call_does_not_break_a_later_answer():
    async def main() -> None:
        stream: OrderedReplies = OrderedReplies(limit=1)
        oldest = place(stream, "a")
        stream.add(oldest)
        loop = asyncio.get_running_loop()

        async def wait_writer() -> None:
            stream.writer = news = loop.create_future()
            await news

        waits = [asyncio.create_task(wait_writer()), asyncio.create_task(stream.room())]
        stream.add(place(stream, "b"))  # over the limit, as a refusal's place may be
        waits.append(asyncio.create_task(stream.idle()))
        await asyncio.sleep(0)
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        oldest("reply")  # the core's answer to a stream whose call is gone: no InvalidStateError
        stream.wake()
        stream.sent()
        stream.sent()
        assert not stream.pending and oldest.answered

    asyncio.run(main())
