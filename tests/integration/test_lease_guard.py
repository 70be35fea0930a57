"""A worker that can no longer renew its leases stops its handlers before the leases run out:
past that, another worker may run the task again, and the handler must not run on beside it.

The worker reaches PostgreSQL through a TCP relay of the test's, which the test cuts: every
connection through it closes and new ones are refused, as when the network to the database
goes away while the process lives."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator

import asyncpg

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, fast_worker

probe = Probe()


@cyclone.step("guard.hold", queue="guard")
async def hold(ctx: cyclone.Context, n: int) -> int:
    if ctx.attempt > 1:
        return n
    probe.started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        probe.stopped.set()
        raise
    return n


class Relay:
    """Forwards TCP connections to ``host:port`` until :meth:`cut`."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        """Close every relayed connection and refuse new ones."""
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()


@contextlib.asynccontextmanager
async def relayed_pool(env: CycloneEnv, relay: Relay) -> AsyncIterator[asyncpg.Pool]:
    port = await relay.start()
    url = urllib.parse.urlsplit(env.dsn)
    dsn = url._replace(netloc=f"{url.username or ''}@127.0.0.1:{port}").geturl()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        pool.terminate()


async def test_handlers_stop_when_the_lease_can_no_longer_be_renewed(
    cyclone_env: CycloneEnv,
) -> None:
    url = urllib.parse.urlsplit(cyclone_env.dsn)
    relay = Relay(url.hostname or "127.0.0.1", url.port or 5432)
    run = await hold.enqueue(cyclone_env.client, 1)
    probe.reset()
    async with relayed_pool(cyclone_env, relay) as pool:
        client = cyclone.Client(pool, notify=False)  # no liveness: only the lease guards it
        worker = fast_worker(client, steps=[hold], lease=3.0, heartbeat=0.5)
        await worker.start()
        try:
            await asyncio.wait_for(probe.started.wait(), 30)
            await relay.cut()
            # Stopped before its 3 s lease runs out, with the database out of reach.
            await asyncio.wait_for(probe.stopped.wait(), 30)
        finally:
            worker.hurry()
            await asyncio.wait_for(worker.stop(timeout=0.1), 30)
    # The task comes back for another worker once its lease has expired.
    async with fast_worker(cyclone_env.client, steps=[hold]):
        assert await run.result(timeout=30) == 1
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "LeaseExpired"
