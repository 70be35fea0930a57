"""``cyclone worker --processes N``: N worker processes of one target under a supervisor.

Plain ``def`` handlers that hold the GIL (CPU-bound code) share one core per process, so
throughput past one core takes processes. The supervisor runs each child as a fresh
interpreter with the same command line, marked by ``CHILD_ENV`` (its number), which makes it
an ordinary single worker: its own id, leases and presence row.

::

    supervisor ── start child 0..N-1 (own process group: a terminal's Ctrl-C reaches
    │             only the supervisor, which forwards it once)
    ├─ relays each child's stderr, each line prefixed with ``[child i]``
    ├─ SIGTERM / SIGINT: forwarded to every child (a second one too: they stop at once)
    ├─ a child that exits while not stopping: started again after a backoff; one that
    │  fails START_TRIES times in a row before it runs stops them all (exit status 1)
    └─ every child exited: status 0 if each exited 0 after the stop, else 1
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

CHILD_ENV = "CYCLONE_WORKER_CHILD"
# A child prints this once its worker runs: from then on, it started.
RUNNING = "running; Ctrl-C stops it"
START_TRIES = 3
BACKOFF_FIRST = 0.5
BACKOFF_MOST = 30.0


def child_number() -> int | None:
    """This process's number under a supervisor, or None when it is not a child."""
    value = os.environ.get(CHILD_ENV)
    return None if value is None else int(value)


def say(message: str) -> None:
    print(f"cyclone: supervisor: {message}", file=sys.stderr, flush=True)


class Supervisor:
    """Runs ``processes`` children, each ``command`` with ``CHILD_ENV`` set to its number."""

    def __init__(self, command: Sequence[str], processes: int) -> None:
        self.command = list(command)
        self.processes = processes
        self._stop = asyncio.Event()
        self._signals = 0
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._failed: list[str] = []

    async def run(self) -> int:
        """Until every child has exited after a signal (or one failed to start); the exit
        status."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._forward, sig)
        await asyncio.gather(*(self._supervise(i) for i in range(self.processes)))
        for message in self._failed:
            say(message)
        return 1 if self._failed else 0

    def _forward(self, sig: signal.Signals, why: str | None = None) -> None:
        self._signals += 1
        if self._signals == 1:
            running = len(self._children)
            say(f"{why or sig.name}: stopping {running} worker{'s' * (running != 1)} gracefully")
        self._stop.set()
        for proc in self._children.values():
            if proc.returncode is None:
                proc.send_signal(sig)

    async def _supervise(self, number: int) -> None:
        tries = 0  # starts in a row that ended before the worker ran
        while not self._stop.is_set():
            env = {**os.environ, CHILD_ENV: str(number)}
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                env=env,
                # Its stdin: a pipe never written to, which ends when this process does.
                stdin=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                process_group=0,
            )
            self._children[number] = proc
            say(f"child {number} started (pid {proc.pid})")
            if self._stop.is_set():  # a signal came while it started: it missed it
                proc.send_signal(signal.SIGTERM)
            ran, last = await self._relay(number, proc)
            code = await proc.wait()
            del self._children[number]
            if self._stop.is_set():
                # Signalled before its worker set its handlers, it died of the signal: stopped.
                stopped = not ran and code in (-signal.SIGTERM, -signal.SIGINT)
                if code != 0 and not stopped:
                    self._failed.append(f"child {number} exited with status {code}")
                return
            tries = 0 if ran else tries + 1
            if tries >= START_TRIES:
                self._failed.append(
                    f"child {number} failed to start {tries} times (status {code}): {last}"
                )
                self._forward(signal.SIGTERM, f"child {number} cannot start")
                return
            delay = min(BACKOFF_MOST, BACKOFF_FIRST * 2**tries)
            say(f"child {number} exited with status {code}; starting it again in {delay:g} s")
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
            except TimeoutError:
                continue

    async def _relay(self, number: int, proc: asyncio.subprocess.Process) -> tuple[bool, str]:
        """Copy the child's stderr to ours, each line prefixed; whether its worker ran, and
        its last line (the error of a child that failed to start)."""
        assert proc.stderr is not None
        ran, last = False, ""
        async for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            sys.stderr.write(f"[child {number}] {line}\n")
            sys.stderr.flush()
            ran = ran or RUNNING in line
            if line.strip():
                last = line.strip()
        return ran, last


def supervise(command: Sequence[str], processes: int) -> int:
    """Run the supervisor to its end; its exit status."""
    return asyncio.run(Supervisor(command, processes).run())
