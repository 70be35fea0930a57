"""Worker processes on one database, for the multi-process benchmark (``benchmarks.scale``).

``python -m benchmarks.fleet DSN CONCURRENCY [RETENTION_SECONDS]`` connects, prints ``ready``,
starts one worker on the benchmark queue (library defaults but the queue's concurrency, and
a client ``retention`` when given, so that the sweeper runs too) when it reads ``go``, and
stops gracefully when its stdin closes. :class:`Fleet` starts and stops a set of them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sys
from pathlib import Path

import asyncpg

import cyclone
from benchmarks.jobs import QUEUE, noop

ROOT = Path(__file__).resolve().parents[1]


async def _serve(dsn: str, concurrency: int, retention: float | None) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    size = min(concurrency, 16) + 4  # claims, completions, heartbeat, maintenance, listener
    async with asyncpg.create_pool(dsn, min_size=2, max_size=size) as pool:
        keep = None
        if retention is not None:
            age = dt.timedelta(seconds=retention)
            keep = cyclone.Retention(completed=age, failed=age, cancelled=age)
        client = cyclone.Client(pool, retention=keep)
        print("ready", flush=True)
        if (await reader.readline()).strip() != b"go":
            return
        async with cyclone.Worker(client, steps=[noop], queues={QUEUE: concurrency}):
            await reader.read()  # until the parent closes our stdin
        await client.aclose()


class Fleet:
    """``processes`` worker processes sharing ``concurrency`` between them."""

    def __init__(
        self, dsn: str, processes: int, concurrency: int, retention: float | None = None
    ) -> None:
        self.dsn, self.processes, self.retention = dsn, processes, retention
        self.each = max(1, concurrency // processes)
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self) -> None:
        """Start every process and wait until each is connected (not yet claiming)."""
        args = [self.dsn, str(self.each)]
        if self.retention is not None:
            args.append(str(self.retention))
        for _ in range(self.processes):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks.fleet",
                *args,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            self.procs.append(proc)
        for proc in self.procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            if line.strip() != b"ready":
                raise RuntimeError(f"fleet worker {proc.pid} did not start: {line!r}")

    def cpu(self) -> float:
        """CPU seconds the worker processes have used so far (user and system)."""
        ticks = 0
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def go(self) -> None:
        """Every worker starts claiming."""
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")

    async def stop(self) -> None:
        """Stop every worker gracefully and wait for its process to end."""
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs:
            code = await asyncio.wait_for(proc.wait(), 120)
            if code != 0:
                raise RuntimeError(f"fleet worker {proc.pid} exited with {code}")
        self.procs.clear()

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if exc[0] is None:
            await self.stop()
            return
        for proc in self.procs:  # a failed run: do not wait on a graceful stop
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


if __name__ == "__main__":
    asyncio.run(
        _serve(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else None)
    )
