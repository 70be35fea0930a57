"""A stream resumed after its reader and its writer died: the writer, a worker process, is
SIGKILLed mid-stream (what it streamed is kept, and the retry streams on as attempt 2);
the reader is cancelled mid-stream and started again from the last offset it handled.
Together the two readers saw every item once, in order."""

from __future__ import annotations

import asyncio
import signal

import asyncpg

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import python_module, reaped
from tests.e2e.stream_app import produce

N = 25  # items per attempt
WAIT = 60.0


async def start_worker(dsn: str, lease: float) -> asyncio.subprocess.Process:
    return await python_module("tests.e2e.stream_app", dsn, lease)


async def test_a_stream_resumes_after_its_reader_and_writer_died(
    cyclone_env: CycloneEnv,
) -> None:
    run = await produce.enqueue(cyclone_env.client, N)
    first: list[cyclone.StreamItem] = []
    three = asyncio.Event()

    async def reader() -> None:
        async for item in run.stream():
            first.append(item)
            if len(first) == 3:
                three.set()

    streamed: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    try:
        await listener.add_listener("e2e_streamed", lambda *a: streamed.put_nowait(str(a[-1])))
        reading = asyncio.create_task(reader())
        async with reaped(await start_worker(cyclone_env.dsn, lease=1.0)) as doomed:
            await asyncio.wait_for(three.wait(), WAIT)
            reading.cancel()  # the reader dies mid-stream
            await asyncio.wait([reading])
            assert await asyncio.wait_for(streamed.get(), WAIT) == str(N)
            doomed.send_signal(signal.SIGKILL)  # the writer dies mid-attempt
            assert await doomed.wait() == -signal.SIGKILL
        # Attempt 1's items are durable though it never completed.
        kept = await cyclone_env.pool.fetchval(
            "SELECT count(*) FROM cyclone_streams WHERE attempt = 1"
        )
        assert kept == N
        assert 3 <= len(first) <= N
        # A new reader from the last offset handled, then a new worker: attempt 2 streams on.
        resumed = asyncio.create_task(_read_from(run, first[-1].offset))
        async with reaped(await start_worker(cyclone_env.dsn, lease=30.0)):
            assert await run.wait(timeout=WAIT) is cyclone.RunState.COMPLETED
            second = await asyncio.wait_for(resumed, WAIT)
    finally:
        await listener.close()
    seen = first + second
    assert [i.offset for i in seen] == list(range(1, 2 * N + 1))  # no gap, no duplicate
    assert [i.value["i"] for i in seen] == list(range(2 * N))
    assert [i.attempt for i in seen] == [1] * N + [2] * N
    assert await run.progress() == {"e2e.produce": {"done": 2 * N, "total": 2 * N}}


async def _read_from(run: cyclone.Run, after: int) -> list[cyclone.StreamItem]:
    return [item async for item in run.stream(after)]
