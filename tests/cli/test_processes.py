"""``cyclone worker --processes N``: real worker processes under a real supervisor."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.process import cli, start
from tests.cli.sync_app import HOLD_LOCK, hold, stuck
from tests.conftest import reaped

WAIT = 60.0


class Lines:
    """The supervisor's stderr, read as it comes, so a test can await a line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.lines: list[str] = []
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._read(proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            self.lines.append(raw.decode())
            self._arrived.set()
        self._arrived.set()

    async def wait_for(self, text: str, count: int = 1) -> list[str]:
        async with asyncio.timeout(WAIT):
            while len(found := [line for line in self.lines if text in line]) < count:
                assert not self._task.done(), "".join(self.lines)
                self._arrived.clear()
                await self._arrived.wait()
        return found


@asynccontextmanager
async def held(env: CycloneEnv) -> AsyncIterator[tuple[asyncpg.Connection, asyncio.Queue[str]]]:
    """The lock the handlers wait on, held; and the queue of their "started" notices."""
    conn = await asyncpg.connect(env.dsn)
    started: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener("cli_sync_started", lambda *a: started.put_nowait(a[-1]))
    await conn.execute("SELECT pg_advisory_lock($1)", HOLD_LOCK)
    try:
        yield conn, started
    finally:
        await conn.close()


async def supervisor(env: CycloneEnv, processes: int) -> asyncio.subprocess.Process:
    return await start(
        "worker",
        "tests.cli.sync_app:WORK",
        "--processes",
        str(processes),
        "--queues",
        "cli_sync=1",  # one handler per child: N running at once are N children
        "--poll-interval",
        "0.1",
        dsn=env.dsn,
    )


async def test_each_child_claims_and_sigterm_drains_them_all(cyclone_env: CycloneEnv) -> None:
    async with (
        held(cyclone_env) as (conn, started),
        reaped(await supervisor(cyclone_env, 3)) as proc,
    ):
        lines = Lines(proc)
        await lines.wait_for("running; Ctrl-C stops it", 3)
        runs = await hold.enqueue_many(cyclone_env.client, [1, 2, 3])
        notices = [await asyncio.wait_for(started.get(), WAIT) for _ in runs]
        assert len({notice.split()[0] for notice in notices}) == 3  # three processes
        workers = await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_workers")
        assert workers == 3  # each child is a worker of its own
        proc.send_signal(signal.SIGTERM)
        # Each child waits for its handler: they finish once the lock is let go.
        await lines.wait_for("stopping gracefully", 3)
        await conn.execute("SELECT pg_advisory_unlock($1)", HOLD_LOCK)
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    assert [await r.result(timeout=WAIT) for r in runs] == [1, 2, 3]
    assert all(line.startswith(("[child ", "cyclone: supervisor:")) for line in lines.lines)


async def test_a_killed_child_is_started_again_and_its_task_completes_once(
    cyclone_env: CycloneEnv,
) -> None:
    async with (
        held(cyclone_env) as (conn, started),
        reaped(await supervisor(cyclone_env, 2)) as proc,
    ):
        lines = Lines(proc)
        await lines.wait_for("running; Ctrl-C stops it", 2)
        run = await hold.enqueue(cyclone_env.client, 7)
        pid, _, attempt = (await asyncio.wait_for(started.get(), WAIT)).split()
        assert attempt == "1"
        victim = await cyclone_env.pool.fetchval(
            "SELECT count(*) FROM cyclone_workers WHERE id LIKE $1", f"%:{pid}:%"
        )
        assert victim == 1
        os.kill(int(pid), signal.SIGKILL)
        await lines.wait_for("exited with status -9; starting it again")
        await lines.wait_for("running; Ctrl-C stops it", 3)  # the new child runs
        # Its sibling (or the new child) finds the process gone and takes the task.
        pid2, _, attempt2 = (await asyncio.wait_for(started.get(), WAIT)).split()
        assert (attempt2, pid2 != pid) == ("2", True)
        await conn.execute("SELECT pg_advisory_unlock($1)", HOLD_LOCK)
        assert await run.result(timeout=WAIT) == 7
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    node = (await run.info()).nodes[0]
    assert (node.state, node.attempts, [e["type"] for e in node.errors]) == (
        "completed",
        2,
        ["WorkerLost"],
    )


async def test_a_child_that_cannot_start_stops_the_supervisor(cyclone_env: CycloneEnv) -> None:
    code, _, err = await cli(
        "worker", "tests.cli.sync_app:WORK", "--processes", "2", "--schema", "1-bad",
        dsn=cyclone_env.dsn,
    )  # fmt: skip
    assert code == 1, err
    assert "failed to start 3 times (status 1): cyclone: --schema must be" in err, err


async def test_a_worker_exits_past_a_thread_that_never_returns(cyclone_env: CycloneEnv) -> None:
    """A plain def handler blocked for an hour: SIGTERM, the shutdown deadline passes, its
    attempt is handed back, and the process exits although the thread still runs."""
    async with held(cyclone_env) as (_, started):
        proc = await start(
            "worker", "tests.cli.sync_app:WORK", "--shutdown-timeout", "0.5", dsn=cyclone_env.dsn
        )
        async with reaped(proc):
            lines = Lines(proc)
            run = await stuck.enqueue(cyclone_env.client, 3600.0)
            await asyncio.wait_for(started.get(), WAIT)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), WAIT) == 0
            await lines.wait_for("1 handler thread still running past the shutdown deadline")
    assert await run.status() is cyclone.RunState.PENDING  # handed back, for any worker
    assert (await run.info()).nodes[0].attempts == 0
