"""Every example runs green against a real database (its own, from the test kit)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from cyclone.testing.plugin import CycloneEnv
from tests.conftest import ROOT


async def run_example(name: str, dsn: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / name),
        cwd=ROOT,
        env={**os.environ, "CYCLONE_DATABASE_URL": dsn},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, text
    return text


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("quickstart.py", ["charged 4200 cents", "receipt job", "completed"]),
        ("recovery.py", ["started recovery", "found recovery", "compensated run"]),
    ],
)
async def test_example_runs(cyclone_env: CycloneEnv, name: str, expected: list[str]) -> None:
    output = await run_example(name, cyclone_env.dsn)
    assert "from CYCLONE_DATABASE_URL" in output
    for text in expected:
        assert text in output
