"""A rolling deploy: the newest migration is applied while a worker of the release before
it (the code of the commit before the one that added it, from the repository's history)
drains jobs, and that worker goes on draining after it, beside a worker of this code."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import cyclone
from cyclone._storage.loader import MIGRATIONS
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import ROOT, fast_worker, reaped

LATEST = MIGRATIONS[-1]
SCHEMA = "rolling"

# The worker of the old release: its own copy of the step (same name and queue), run by the
# old package, reporting each job it ran on a table of its own.
OLD_WORKER = """
import asyncio, sys
import asyncpg
import cyclone

@cyclone.step("upgrade.tick", queue="upgrade")
async def tick(ctx: cyclone.Context, n: int) -> int:
    await ctx.client.pool.execute("INSERT INTO rolling_ran (n, who) VALUES ($1, 'old')", n)
    return n

async def main(dsn: str) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.Client(pool, schema=sys.argv[2])
        await client.migrate()  # the old release's migrations: all but the newest
        async with cyclone.Worker(client, steps=[tick], poll_interval=0.1):
            print("ready", cyclone.__file__, flush=True)
            await asyncio.Event().wait()

asyncio.run(main(sys.argv[1]))
"""


@cyclone.step("upgrade.tick", queue="upgrade")
async def tick(ctx: cyclone.Context, n: int) -> int:
    await ctx.client.pool.execute("INSERT INTO rolling_ran (n, who) VALUES ($1, 'new')", n)
    return n


def old_release(into: Path) -> Path:
    """The package as it was just before the newest migration was added, unpacked."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's history (git)")
    path = f"cyclone/_storage/sql/migrations/{LATEST.version:04d}_{LATEST.name}.sql"
    added = subprocess.run(
        [git, "log", "--diff-filter=A", "--format=%H", "--", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert added, f"{path} is not in the history"
    before = f"{added[-1]}^"
    known = subprocess.run([git, "rev-parse", "--verify", "--quiet", before], cwd=ROOT)
    if known.returncode != 0:
        pytest.skip("needs the commit before the newest migration (a shallow clone lacks it)")
    archive = into / "old.tar"
    subprocess.run(
        [git, "archive", "--format=tar", "-o", str(archive), before, "cyclone"],
        cwd=ROOT,
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


async def test_the_newest_migration_applies_while_old_workers_drain(
    cyclone_env: CycloneEnv, tmp_path: Path
) -> None:
    old = old_release(tmp_path)
    await cyclone_env.pool.execute("CREATE TABLE rolling_ran (n int, who text)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYCLONE_")}
    env["PYTHONPATH"] = str(old)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        OLD_WORKER,
        cyclone_env.dsn,
        SCHEMA,
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    client = cyclone.Client(cyclone_env.pool, schema=SCHEMA)
    async with reaped(proc):
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().split()
        assert line[0] == "ready" and line[1].startswith(str(old)), line  # the old package
        versions = {
            r[0]
            for r in await cyclone_env.pool.fetch(
                f"SELECT version FROM {SCHEMA}.cyclone_migrations"
            )
        }
        assert LATEST.version not in versions  # the old release's schema
        before = [await tick.enqueue(client, n) for n in range(20)]
        assert await client.migrate() == [LATEST.version]  # while it drains
        after = [await tick.enqueue(client, n) for n in range(20, 40)]
        for run in [*before, *after]:
            assert await run.result(timeout=60) in range(40)
        # This release's worker beside it, on the migrated schema.
        async with fast_worker(client, steps=[tick]):
            more = [await tick.enqueue(client, n) for n in range(40, 60)]
            for run in more:
                assert await run.result(timeout=60) in range(60)
        assert proc.returncode is None  # the old worker ran through it all
    ran = await cyclone_env.pool.fetch("SELECT who, count(*) FROM rolling_ran GROUP BY who")
    counts = dict(ran)
    assert sum(counts.values()) == 60 and counts.get("old", 0) >= 40
