"""Running the real ``cyclone`` console script in a subprocess, as a user would."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = str(Path(sys.executable).parent / "cyclone")


def environment(dsn: str | None, *, pythonpath: bool = True) -> dict[str, str]:
    """This process's environment without Cyclone's variables, plus ``dsn`` if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYCLONE_")}
    env.pop("PYTHONPATH", None)
    if dsn is not None:
        env["CYCLONE_DATABASE_URL"] = dsn
    if pythonpath:
        env["PYTHONPATH"] = str(ROOT)
    return env


async def cli(
    *args: str,
    dsn: str | None = None,
    timeout: float = 60,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """Run ``cyclone ARGS`` to its end: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        SCRIPT,
        *args,
        cwd=cwd,
        env=environment(dsn) if env is None else env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def start(
    *args: str, dsn: str | None = None, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """Start ``cyclone ARGS`` (a worker) with its stderr piped."""
    return await asyncio.create_subprocess_exec(
        SCRIPT,
        *args,
        cwd=cwd,
        env=environment(dsn) if env is None else env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def line_with(proc: asyncio.subprocess.Process, text: str, timeout: float = 60) -> str:
    """Read the process's stderr until a line holds ``text``; return that line."""
    assert proc.stderr is not None
    async with asyncio.timeout(timeout):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, f"the process exited before printing {text!r}"
            if text in line:
                return line


def one_line_error(code: int, err: str) -> str:
    """The one line a failed command printed; no traceback."""
    assert code != 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]
