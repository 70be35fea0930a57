"""Rescue by liveness: a worker's own session holds an advisory lock while it lives. When
that session ends, its peers release its tasks (WorkerLost) once the lock has stayed free
past the worker's grace, or at once when its process is known gone; a worker that lives
takes its lock again at once and keeps its handlers."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import sys
import urllib.parse

import asyncpg
import pytest

import cyclone
from cyclone._storage import queries as db
from cyclone._worker.presence import Lookout, machine_identity
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, dead_worker_running, fast_worker

probe = Probe()
CANCELLED: list[int] = []  # attempts of live.hold that were cancelled


@pytest.fixture(autouse=True)
def _reset() -> None:
    probe.reset()
    CANCELLED.clear()


@cyclone.step("live.hold", queue="live")
async def hold(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(ctx.attempt)
    if ctx.attempt == 1 and n < 50:
        probe.started.set()
        try:
            await probe.stopped.wait()
        except asyncio.CancelledError:
            CANCELLED.append(ctx.attempt)
            raise
    return n


async def liveness_backend(env: CycloneEnv, worker: cyclone.Worker) -> int:
    """The pid of the session holding ``worker``'s liveness lock."""
    key = worker._presence.key
    assert key is not None
    pid: int = await env.pool.fetchval(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 1668899693"
        " AND objid = $1::int::oid AND objsubid = 2 AND granted",
        key,
    )
    return pid


async def test_a_worker_holds_its_liveness_lock_and_names_it(cyclone_env: CycloneEnv) -> None:
    async with fast_worker(cyclone_env.client, steps=[hold]) as worker:
        row = await cyclone_env.pool.fetchrow(
            "SELECT liveness FROM public.cyclone_workers WHERE id = $1", worker.id
        )
        assert row is not None and row["liveness"] == worker._presence.key
        assert await liveness_backend(cyclone_env, worker) > 0
        async with cyclone_env.pool.acquire() as conn:
            assert await db.workers_lost(conn, cyclone_env.client._queries) == []
    # Stopped: the session is closed and the row gone, so nobody takes it for lost.
    async with cyclone_env.pool.acquire() as conn:
        assert await db.workers_lost(conn, cyclone_env.client._queries) == []


async def looks(worker: cyclone.Worker, count: int) -> None:
    """Wait until ``worker``'s rescue probe has looked for lost peers ``count`` more times."""
    presence = worker._presence
    done = asyncio.Event()
    seen = 0
    look = presence.look

    async def counted() -> Lookout:
        nonlocal seen
        lookout = await look()
        seen += 1
        if seen >= count:
            done.set()
        return lookout

    presence.look = counted  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(done.wait(), 60)
    finally:
        del presence.look


async def test_a_cut_session_is_not_a_death(cyclone_env: CycloneEnv) -> None:
    """The session of the worker running attempt 1 is terminated while its process lives:
    it takes its lock again at once and finishes the handler, once; its peer, looking on
    past the grace, releases nothing."""
    run = await hold.enqueue(cyclone_env.client, 5)
    async with fast_worker(cyclone_env.client, steps=[hold], lease=30.0) as cut:
        await asyncio.wait_for(probe.started.wait(), 30)
        async with fast_worker(cyclone_env.client, steps=[hold], lease=30.0) as peer:
            first = await liveness_backend(cyclone_env, cut)
            assert await cyclone_env.pool.fetchval("SELECT pg_terminate_backend($1::int)", first)
            await looks(peer, 6)  # two seconds and more: past the grace of 1 s
            assert cut._presence.live.is_set()
            assert await liveness_backend(cyclone_env, cut) != first
            probe.stopped.set()
            assert await run.result(timeout=30) == 5
    assert probe.calls == [1] and CANCELLED == []
    assert (await run.info()).nodes[0].errors == []


async def test_a_worker_takes_its_lock_again_and_claims_again(cyclone_env: CycloneEnv) -> None:
    """Alone, a worker whose session ended takes its lock again on a new session, names its
    new backend, and claims again while its first handler runs on."""
    run = await hold.enqueue(cyclone_env.client, 6)
    async with fast_worker(cyclone_env.client, steps=[hold], lease=30.0) as worker:
        await asyncio.wait_for(probe.started.wait(), 30)
        first = await liveness_backend(cyclone_env, worker)
        assert await cyclone_env.pool.fetchval("SELECT pg_terminate_backend($1::int)", first)
        later = await hold.enqueue(cyclone_env.client, 60)  # attempt 1 of its own
        probe.calls.clear()
        probe.stopped.set()
        assert await later.result(timeout=30) == 60
        assert await run.result(timeout=30) == 6
        again = await liveness_backend(cyclone_env, worker)
        assert again != first
        backend = await cyclone_env.pool.fetchval(
            "SELECT backend FROM public.cyclone_workers WHERE id = $1", worker.id
        )
        assert backend == again
    assert (await run.info()).nodes[0].errors == [] and CANCELLED == []


class Rescues(cyclone.Observer):
    """Records the releases this process's workers made, and which of its workers were
    released for lost while alive."""

    def __init__(self) -> None:
        self.releases: list[tuple[str, int]] = []
        self.alive: list[str] = []

    def released(self, reason: str, count: int) -> None:
        self.releases.append((reason, count))

    def rescued_alive(self, worker: str) -> None:
        self.alive.append(worker)


async def test_a_dead_process_of_this_machine_is_released_at_once(
    cyclone_env: CycloneEnv,
) -> None:
    """A peer on the same machine finds the process gone: it releases the task without
    waiting for the grace, and the attempt's error says who held it and who released it."""
    run = await hold.enqueue(cyclone_env.client, 9)
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    await dead_worker_running(
        cyclone_env, run, "dead-here", 44, pid=gone.pid, machine=machine_identity(), grace=3600
    )
    rescues = Rescues()
    cyclone_env.client.observe(rescues)
    async with fast_worker(cyclone_env.client, steps=[hold]) as peer:
        assert await run.result(timeout=30) == 9
    assert rescues.releases == [("worker_lost", 1)]  # counted by reason
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost" and error["reason"] == "worker_lost"
    assert error["worker"] == "dead-here" and error["pid"] == gone.pid
    assert error["host"] == "h" and error["released_by"] == peer.id
    assert {"last_seen", "lock_free_since", "released_at"} <= error.keys()


async def test_a_lost_worker_elsewhere_is_released_after_its_grace(
    cyclone_env: CycloneEnv,
) -> None:
    """A worker of another machine whose lock is free: its peers cannot see its process,
    so they release its task once the lock has stayed free for its grace."""
    run = await hold.enqueue(cyclone_env.client, 10)
    await dead_worker_running(cyclone_env, run, "dead-there", 45, machine="elsewhere", grace=1.5)
    async with fast_worker(cyclone_env.client, steps=[hold]):
        assert await run.result(timeout=30) == 10
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost" and error["grace"] == 1.5
    free = dt.datetime.fromisoformat(error["lock_free_since"])
    released = dt.datetime.fromisoformat(error["released_at"])
    assert released - free >= dt.timedelta(seconds=1.5)


async def test_without_a_listener_a_worker_holds_no_lock(cyclone_env: CycloneEnv) -> None:
    """notify=False (a pooler in transaction mode, no listen_dsn): no session of its own, so
    its row names no lock and its tasks wait for their leases."""
    client = cyclone.Client(cyclone_env.pool, notify=False)
    async with fast_worker(client, steps=[hold]) as worker:
        liveness = await cyclone_env.pool.fetchval(
            "SELECT liveness FROM public.cyclone_workers WHERE id = $1", worker.id
        )
        assert liveness is None and worker._presence.key is None
        held = await cyclone_env.pool.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1668899693"
        )
        assert held == 0


async def test_a_row_naming_a_lock_nobody_holds_is_lost(cyclone_env: CycloneEnv) -> None:
    """As a killed worker's row looks until it expires: found lost, and its running task
    released with WorkerLost by any worker's maintenance."""
    run = await hold.enqueue(cyclone_env.client, 7)
    q = cyclone_env.client._queries
    await dead_worker_running(cyclone_env, run, "ghost", 42)
    async with cyclone_env.pool.acquire() as conn:
        assert await db.workers_lost(conn, q) == ["ghost"]
        # A session that takes the lock makes it live again.
        other = await asyncpg.connect(cyclone_env.dsn)
        try:
            assert await db.worker_liveness_hold(other, q, 42)
            assert await db.workers_lost(conn, q) == []
        finally:
            await other.close()
        assert await db.workers_lost(conn, q) == ["ghost"]
    async with fast_worker(cyclone_env.client, steps=[hold]) as worker:
        await worker.maintain_once()
        assert await run.result(timeout=20) == 7
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost" and "ghost" in error["message"]


async def test_a_second_live_worker_under_one_id_is_refused(cyclone_env: CycloneEnv) -> None:
    """Two live workers under one id would share a row, and one's death would release the
    other's tasks: the second is refused at start. Once the first stops, the id is free."""
    async with fast_worker(cyclone_env.client, steps=[hold], worker_id="twin"):
        second = fast_worker(cyclone_env.client, steps=[hold], worker_id="twin")
        with pytest.raises(cyclone.InvalidStateError, match="another live worker runs as 'twin'"):
            await second.start()
        row = await cyclone_env.pool.fetchval(
            "SELECT count(*) FROM public.cyclone_workers WHERE id = 'twin'"
        )
        assert row == 1  # the first one's row is left alone
        locks = await cyclone_env.pool.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1668899693"
        )
        assert locks == 1  # the refused one kept no session
    async with fast_worker(cyclone_env.client, steps=[hold], worker_id="twin") as again:
        assert again._presence.live.is_set()


async def test_a_worker_started_again_under_its_id_releases_its_old_tasks(
    cyclone_env: CycloneEnv,
) -> None:
    """A fixed worker_id (a pod's name) started again after its process died: the row still
    names the old, free lock, so the new process releases the old one's tasks at start."""
    run = await hold.enqueue(cyclone_env.client, 8)
    await dead_worker_running(cyclone_env, run, "pod-1", 43)
    async with fast_worker(cyclone_env.client, steps=[hold], worker_id="pod-1"):
        assert await run.result(timeout=20) == 8
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost"


class Cable:
    """A TCP proxy in front of the test's server, to cut a client off from it: ``cut()``
    closes every connection through it and refuses new ones until ``mend()``."""

    def __init__(self, dsn: str) -> None:
        self._target = urllib.parse.urlsplit(dsn)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.open = True

    async def __aenter__(self) -> Cable:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()

    def dsn(self) -> str:
        """The test's DSN, through this proxy."""
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        netloc = self._target.netloc.rsplit("@", 1)
        where = f"127.0.0.1:{port}"
        return self._target._replace(
            netloc=f"{netloc[0]}@{where}" if len(netloc) > 1 else where
        ).geturl()

    def cut(self) -> None:
        self.open = False
        for writer in self._links:
            writer.transport.abort()
        self._links.clear()

    def mend(self) -> None:
        self.open = True

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(
            self._target.hostname, self._target.port
        )
        self._links |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._links -= {writer, up_writer}


async def test_a_worker_without_a_session_says_it_lives_through_its_pool(
    cyclone_env: CycloneEnv,
) -> None:
    """Its liveness session is cut and cannot come back for several graces, but its pool
    still reaches the database: it says it lives, and its peer releases nothing."""
    run = await hold.enqueue(cyclone_env.client, 11)
    async with Cable(cyclone_env.dsn) as cable:
        client = cyclone.Client(cyclone_env.pool, listen_dsn=cable.dsn())
        async with fast_worker(client, steps=[hold], lease=30.0) as cut:
            await asyncio.wait_for(probe.started.wait(), 30)
            async with fast_worker(cyclone_env.client, steps=[hold], lease=30.0) as peer:
                cable.cut()
                await looks(peer, 8)  # three seconds and more, three graces
                assert not cut._presence.live.is_set()
                cable.mend()
                await asyncio.wait_for(cut._presence.live.wait(), 30)
                probe.stopped.set()
                assert await run.result(timeout=30) == 11
    assert probe.calls == [1] and CANCELLED == []


async def test_a_worker_cut_off_past_its_grace_learns_it_was_released(
    cyclone_env: CycloneEnv,
) -> None:
    """Its pool and its session are both cut past its grace: its peer releases its task,
    and once it is back it counts and logs that it was taken for dead while alive, and its
    handler of that attempt is stopped; the run completes once, by the next attempt."""
    run = await hold.enqueue(cyclone_env.client, 12)
    rescues = Rescues()
    async with Cable(cyclone_env.dsn) as cable:
        pool = await asyncpg.create_pool(cable.dsn(), min_size=1, max_size=4)
        client = cyclone.Client(pool)
        client.observe(rescues)
        try:
            async with fast_worker(client, steps=[hold], lease=30.0) as cut:
                await asyncio.wait_for(probe.started.wait(), 30)
                async with fast_worker(cyclone_env.client, steps=[hold], lease=30.0) as peer:
                    cable.cut()
                    assert await run.result(timeout=30) == 12  # attempt 2, on the peer
                    cable.mend()
                    await asyncio.wait_for(cut._presence.live.wait(), 30)
                    await asyncio.wait_for(cut.idle(), 30)  # attempt 1 stopped
        finally:
            await pool.close()
    assert rescues.alive == [cut.id]
    assert probe.calls == [1, 2] and CANCELLED == [1]
    [error] = (await run.info()).nodes[0].errors
    assert error["released_by"] == peer.id and error["worker"] == cut.id


async def test_a_lost_workers_last_attempt_fails_and_is_counted(cyclone_env: CycloneEnv) -> None:
    """On its last attempt, a dead worker's task fails its run instead of going back, and
    the release is counted all the same."""
    run = await hold.enqueue(cyclone_env.client, 13)
    await dead_worker_running(cyclone_env, run, "dead-last", 48)
    await cyclone_env.pool.execute(
        "UPDATE public.cyclone_tasks SET max_attempts = 1 WHERE run_id = $1", run.id
    )
    rescues = Rescues()
    cyclone_env.client.observe(rescues)
    async with fast_worker(cyclone_env.client, steps=[hold]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    assert rescues.releases == [("worker_lost", 1)]
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost" and error["worker"] == "dead-last"
