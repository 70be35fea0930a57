"""One chaos scenario's processes, clock and ledger arithmetic.

A :class:`Scene` owns a database on the scenario's own cluster, worker processes and a producer
process. The test starts them, waits through a pre-fault window, injects its fault (marking
when it ends), lets the producer run on through a post-fault window, stops it, waits for the
queue to drain and asks :meth:`Scene.figures` what the ledger says.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

import cyclone
from tests.chaos.app import SCHEMA
from tests.conftest import python_module


def setting(name: str, default: float) -> float:
    """A duration or rate from ``CHAOS_<NAME>`` (seconds), for longer local runs."""
    return float(os.environ.get(f"CHAOS_{name.upper()}", default))


BUCKET = 0.5  # seconds per throughput bucket
RECOVERY_TARGET = 5.0  # seconds from a fault's end to 90 % of the pre-fault throughput
DRAIN_TIMEOUT = 240.0  # generous: a job lost with its worker waits out its lease


@dataclass
class Figures:
    """What one scenario measured."""

    scenario: str
    jobs: int
    lost: int
    duplicated: int
    reexecuted: int
    recovery_s: float
    catchup_s: float
    throughput_ratio: float
    fault_ratio: float
    pre_rate: float
    worker_lost: int
    errors: int
    false_errors: int
    error_lines: list[str] = field(default_factory=list)

    def row(self) -> list[str]:
        """The table row: numbers formatted for reading."""
        return [
            self.scenario,
            str(self.jobs),
            str(self.lost),
            str(self.duplicated),
            str(self.reexecuted),
            _seconds(self.recovery_s),
            _seconds(self.catchup_s),
            f"{self.throughput_ratio:.2f}",
            f"{self.fault_ratio:.2f}",
            f"{self.pre_rate:.0f}",
            str(self.worker_lost),
            f"{self.errors}/{self.false_errors}",
        ]


HEADER = [
    "scenario",
    "jobs",
    "lost",
    "duplicated",
    "re-executed",
    "recovery s",
    "catch-up s",
    "throughput ratio",
    "during the fault",
    "pre-fault effects/s",
    "WorkerLost",
    "ERROR lines/false",
]


def _seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.1f}"


@dataclass
class Proc:
    """A worker or producer process and the file its stderr goes to."""

    process: asyncio.subprocess.Process
    stderr: Path
    killed: bool = False


class Scene:
    """The processes and ledger of one scenario on database ``chaos`` of a cluster."""

    def __init__(
        self,
        name: str,
        dsn: str,
        admin_dsn: str,
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.dsn = dsn
        self.admin_dsn = admin_dsn
        self.workdir = workdir
        self.env = env or {}  # for the worker and producer processes
        self.workers: list[Proc] = []
        self.producer: Proc | None = None
        self.fault_start = 0.0
        self.fault_end = 0.0
        self.post_end = 0.0
        self._spawned = 0

    async def prepare(self, *, create: bool = True) -> None:
        """Create the scenario's database (unless ``create`` is false: it exists), migrate
        it and add the ledger tables."""
        if create:
            admin = await asyncpg.connect(self.admin_dsn)
            try:
                await admin.execute("CREATE DATABASE chaos")
            finally:
                await admin.close()
        async with asyncpg.create_pool(self.dsn, min_size=1, max_size=2) as pool:
            await cyclone.Client(pool).migrate()
            await pool.execute(SCHEMA)

    async def _spawn(self, *args: str) -> Proc:
        self._spawned += 1
        stderr = self.workdir / f"{self.name}-{self._spawned}-{args[0]}.log"
        with stderr.open("wb") as sink:
            process = await python_module(
                "tests.chaos.app", *args, env=self.env, stdout=asyncio.subprocess.PIPE, stderr=sink
            )
        proc = Proc(process, stderr)
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = await process.stdout.readline()
        assert line == b"ready\n", f"{args[0]} did not start: {line!r}\n{stderr.read_text()}"
        return proc

    async def start_worker(self, lease: float) -> Proc:
        """Start a worker process (it is ready to claim when this returns)."""
        proc = await self._spawn("work", self.dsn, str(lease))
        self.workers.append(proc)
        return proc

    async def start_producer(self, rate: float, *, mode: str = "job") -> None:
        """Start the producer at ``rate`` runs per second of ``mode``: job, flow or map."""
        self.producer = await self._spawn("produce", self.dsn, str(rate), mode)

    async def reap(self) -> None:
        """Kill whatever process of the scenario still runs, and wait for each."""
        for proc in [*self.workers, *([self.producer] if self.producer else [])]:
            if proc.process.returncode is None:
                proc.process.kill()
            await proc.process.wait()

    async def kill(self, worker: Proc) -> None:
        """SIGKILL a worker and reap it."""
        worker.process.send_signal(signal.SIGKILL)
        assert await worker.process.wait() == -signal.SIGKILL
        worker.killed = True

    def begin_fault(self) -> None:
        """Mark the fault's start."""
        self.fault_start = time.time()

    def end_fault(self) -> None:
        """Mark the fault's end (the database reachable again, the killed worker replaced)."""
        self.fault_end = time.time()

    async def keeping_up(self, backlog: int) -> None:
        """Wait until effects commit and fewer than ``backlog`` ledger runs are unfinished: the
        workers keep up with the producer. At once on a plain server; on Citus a fresh
        connection's first query can take a second (asyncpg asks for type details, a slow
        query there), so the workers start with a backlog that a pre-fault window must not
        measure."""
        async with asyncpg.create_pool(self.dsn, min_size=1, max_size=1) as pool:
            async with asyncio.timeout(DRAIN_TIMEOUT):
                while not await pool.fetchval(  # noqa: ASYNC110 - other processes' progress
                    "SELECT EXISTS (SELECT FROM chaos_effects) AND (SELECT count(*)"
                    " FROM chaos_ledger l LEFT JOIN cyclone_runs r ON r.id = l.run_id"
                    " WHERE r.state IS DISTINCT FROM 'completed') < $1",
                    backlog,
                ):
                    await asyncio.sleep(0.2)

    async def finish(self, post: float) -> None:
        """Run through the post-fault window, stop the producer and wait for the queue to drain."""
        await asyncio.sleep(max(0.0, self.fault_end + post - time.time()))
        self.post_end = time.time()
        assert self.producer is not None
        self.producer.process.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            assert await self.producer.process.wait() == 0, self.producer.stderr.read_text()
        async with asyncpg.create_pool(self.dsn, min_size=1, max_size=1) as pool:
            async with asyncio.timeout(DRAIN_TIMEOUT):
                while await pool.fetchval(  # noqa: ASYNC110 - other processes' progress
                    "SELECT count(*) FROM chaos_ledger l"
                    " LEFT JOIN cyclone_runs r ON r.id = l.run_id"
                    " WHERE r.state IS DISTINCT FROM 'completed'"
                ):
                    await asyncio.sleep(0.2)

    async def stop_workers(self) -> list[int]:
        """Stop the live workers gracefully; the exit codes of those the scenario did not kill,
        each checked to have been running until now (no restart behind our back)."""
        live = [w for w in self.workers if not w.killed]
        for w in live:
            assert w.process.returncode is None, f"worker died:\n{w.stderr.read_text()[-3000:]}"
            w.process.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            return [await w.process.wait() for w in live]

    async def idle_survivors(self) -> list[int]:
        """The pids of workers that ran until the end but committed no effect after the fault."""
        async with asyncpg.create_pool(self.dsn, min_size=1, max_size=1) as pool:
            busy = {
                r["pid"]
                for r in await pool.fetch(
                    "SELECT DISTINCT pid FROM chaos_effects"
                    " WHERE extract(epoch FROM pg_xact_commit_timestamp(xmin)) > $1",
                    self.fault_end,
                )
            }
        return [w.process.pid for w in self.workers if not w.killed and w.process.pid not in busy]

    async def figures(self) -> Figures:
        """Count the ledger, effects and attempts; time the recovery from commit timestamps."""
        async with asyncpg.create_pool(self.dsn, min_size=1, max_size=1) as pool:
            return await self._figures(pool)

    async def _figures(self, pool: asyncpg.Pool) -> Figures:
        expected = (
            "SELECT l.run_id, n.node, l.seq FROM chaos_ledger l"
            " CROSS JOIN LATERAL unnest(l.nodes) AS n(node)"
            # Every child run of a ledger run runs its node "x" once.
            " UNION ALL SELECT r.id, 'x', l.seq FROM chaos_ledger l"
            " JOIN cyclone_runs r ON r.parent_run = l.run_id"
        )
        row = await pool.fetchrow(
            f"WITH e AS ({expected}),"
            " eff AS (SELECT run_id, node, count(*) AS n FROM chaos_effects GROUP BY 1, 2),"
            " att AS (SELECT run_id, node, count(*) AS n FROM chaos_attempts GROUP BY 1, 2)"
            " SELECT (SELECT count(*) FROM chaos_ledger) AS jobs,"
            "  (SELECT count(*) FROM e LEFT JOIN eff USING (run_id, node)"
            "    WHERE coalesce(eff.n, 0) = 0) AS lost,"
            "  (SELECT count(*) FROM chaos_ledger l LEFT JOIN cyclone_runs r ON r.id = l.run_id"
            "    WHERE r.state IS DISTINCT FROM 'completed') AS unfinished,"
            "  (SELECT coalesce(sum(n - 1), 0) FROM eff WHERE n > 1) AS duplicated,"
            "  (SELECT count(*) FROM chaos_effects f WHERE NOT EXISTS"
            "    (SELECT 1 FROM e WHERE e.run_id = f.run_id AND e.node = f.node)) AS strays,"
            "  (SELECT coalesce(sum(n - 1), 0) FROM att WHERE n > 1) AS reexecuted"
        )
        assert row is not None
        assert row["strays"] == 0, "effects of runs missing from the ledger"
        # Commit times of every effect, in seconds since the epoch (server and test share a clock).
        times = sorted(
            r[0]
            for r in await pool.fetch(
                "SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8"
                " FROM chaos_effects"
            )
        )
        catchup = await pool.fetchval(
            "SELECT max(extract(epoch FROM pg_xact_commit_timestamp(f.xmin))::float8)"
            " FROM chaos_effects f JOIN chaos_ledger l USING (run_id)"
            " WHERE extract(epoch FROM pg_xact_commit_timestamp(l.xmin)) < $1",
            self.fault_end,
        )
        # Attempts released as their worker's (WorkerLost), in the error histories of jobs
        # and of workflow nodes.
        worker_lost = await pool.fetchval(
            "SELECT (SELECT count(*) FROM cyclone_runs r, jsonb_array_elements(r.errors) e"
            "        WHERE e->>'type' = 'WorkerLost')"
            " + (SELECT count(*) FROM cyclone_steps s, jsonb_array_elements(s.errors) e"
            "    WHERE e->>'type' = 'WorkerLost')"
        )
        errors, false_errors = await self._error_lines(pool)
        pre = self.fault_start - self._pre_start()
        pre_rate = _count(times, self._pre_start(), self.fault_start) / pre
        return Figures(
            scenario=self.name,
            jobs=row["jobs"],
            lost=row["lost"] + row["unfinished"],
            duplicated=row["duplicated"],
            reexecuted=row["reexecuted"],
            recovery_s=self._recovery(times, pre_rate),
            catchup_s=max(0.0, (catchup or self.fault_end) - self.fault_end),
            throughput_ratio=_count(times, self.fault_start, self.post_end)
            / (pre_rate * (self.post_end - self.fault_start)),
            fault_ratio=_count(times, self.fault_start, self.fault_end)
            / (pre_rate * max(self.fault_end - self.fault_start, BUCKET)),
            pre_rate=pre_rate,
            worker_lost=worker_lost,
            errors=len(errors),
            false_errors=len(false_errors),
            error_lines=errors,
        )

    pre_window = 3.0

    def _pre_start(self) -> float:
        return self.fault_start - self.pre_window

    def _recovery(self, times: list[float], pre_rate: float) -> float:
        """Seconds from the fault's end to the first 0.5 s bucket at 90 % of the pre-fault rate."""
        need = 0.9 * pre_rate * BUCKET
        start = self.fault_end
        while start + BUCKET <= self.post_end:
            if _count(times, start, start + BUCKET) >= need:
                return start - self.fault_end
            start += BUCKET
        return math.inf

    async def _error_lines(self, pool: asyncpg.Pool) -> tuple[list[str], list[str]]:
        """The workers' ERROR lines, and those about an attempt whose effect in fact committed."""
        errors: list[str] = []
        false: list[str] = []
        for line in self.log_lines():
            if line.get("level") in ("ERROR", "CRITICAL"):
                summary = f"{line['msg']} run={line['run_id']} node={line['node']}"
                summary += f" attempt={line['attempt']}"
                errors.append(summary + _last_line(line.get("exc")))
                if line["run_id"] and await pool.fetchval(
                    "SELECT count(*) FROM chaos_effects"
                    " WHERE run_id = $1 AND node = $2 AND attempt = $3",
                    uuid.UUID(line["run_id"]),
                    line["node"] or "",
                    line["attempt"],
                ):
                    false.append(summary)
        return errors, false

    def log_lines(self) -> list[dict[str, Any]]:
        """Every worker's log lines (WARNING and above), parsed, worker by worker."""
        lines: list[dict[str, Any]] = []
        for w in self.workers:
            for text in w.stderr.read_text(errors="replace").splitlines():
                try:
                    lines.append(json.loads(text))
                except ValueError:
                    continue  # a traceback's continuation lines belong to a JSON line's "exc"
        return lines


def _last_line(exc: str | None) -> str:
    return f" ({exc.strip().splitlines()[-1]})" if exc else ""


def _count(times: list[float], start: float, end: float) -> int:
    return bisect.bisect_left(times, end) - bisect.bisect_left(times, start)
