"""A rolling deploy, for each migration: it is applied while a worker of the release before it
(the code of the commit before the one that added it, from the repository's history)
drains jobs, and that worker goes on draining after it; beside the newest one, a worker of
this code drains too."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import cyclone
from cyclone._storage.loader import MIGRATIONS, Migration
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import ROOT, fast_worker, reaped

SCHEMA = "rolling"

# The old release: its own copy of the step (same name and queue), run by the old package,
# reporting each job it ran on a table of its own. It enqueues 20 jobs, says so, waits until
# the test has applied the migration, enqueues 20 more and waits for all 40 results. Only
# names every release since the first has kept.
OLD_RELEASE = """
import asyncio, sys
import asyncpg
import cyclone

pool = None

@cyclone.step("upgrade.tick", queue="upgrade")
async def tick(ctx: cyclone.Context, n: int) -> int:
    await pool.execute("INSERT INTO rolling_ran (n, who) VALUES ($1, 'old')", n)
    return n

async def main(dsn: str, schema: str) -> None:
    global pool
    line = lambda: asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.Client(pool, schema=schema)
        await client.migrate()  # the old release's migrations
        async with cyclone.Worker(client, steps=[tick], poll_interval=0.1):
            runs = [await cyclone.enqueue(client, tick, n) for n in range(20)]
            print("ready", cyclone.__file__, flush=True)
            await line()  # the migration is applied
            runs += [await cyclone.enqueue(client, tick, n) for n in range(20, 40)]
            for run in runs:
                await run.result(timeout=60)
            print("drained", flush=True)
            await line()  # this release's worker drained beside it

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@cyclone.step("upgrade.tick", queue="upgrade")
async def tick(ctx: cyclone.Context, n: int) -> int:
    await ctx.client.pool.execute("INSERT INTO rolling_ran (n, who) VALUES ($1, 'new')", n)
    return n


# Wherever the package has kept its migrations over time.
MIGRATION_FILES = ":(glob)cyclone/**/migrations/*.sql"


def old_release(migration: Migration, into: Path) -> tuple[Path, int]:
    """The package of the release before ``migration``, unpacked, and the last migration it
    has: main's history (its first parents) just before the first commit whose migrations
    reach that number. (Branches may land migrations out of order: that release may then
    lack more than one migration up to this one.)"""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's history (git)")

    def run(*args: str) -> str:
        return subprocess.run(
            [git, *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout

    def last_migration(commit: str) -> int:
        names = run("ls-tree", "-r", "--name-only", commit, "cyclone").split()
        found = [re.search(r"/migrations/(\d{4})_\w+\.sql$", n) for n in names]
        return max((int(m[1]) for m in found if m), default=0)

    reaching = None  # the oldest commit so far whose migrations reach this one
    for commit in run("log", "--first-parent", "--format=%H", "--", MIGRATION_FILES).split():
        if last_migration(commit) < migration.version:
            break
        reaching = commit
    assert reaching, f"migration {migration.version:04d} is not in the history"
    before = f"{reaching}^"
    known = subprocess.run([git, "rev-parse", "--verify", "--quiet", before], cwd=ROOT)
    if known.returncode != 0:
        pytest.skip("needs the commit before the migration (a shallow clone lacks it)")
    archive = into / "old.tar"
    subprocess.run(
        [git, "archive", "--format=tar", "-o", str(archive), before, "cyclone"],
        cwd=ROOT,
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into, last_migration(before)


@pytest.mark.parametrize("migration", MIGRATIONS[1:], ids=lambda m: f"{m.version:04d}_{m.name}")
async def test_each_migration_applies_while_old_workers_drain(
    cyclone_env: CycloneEnv, tmp_path: Path, migration: Migration
) -> None:
    old, had = old_release(migration, tmp_path)
    await cyclone_env.pool.execute("CREATE TABLE rolling_ran (n int, who text)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYCLONE_")}
    env["PYTHONPATH"] = str(old)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        OLD_RELEASE,
        cyclone_env.dsn,
        SCHEMA,
        cwd=tmp_path,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    client = cyclone.Client(cyclone_env.pool, schema=SCHEMA)
    newest = migration is MIGRATIONS[-1]
    async with reaped(proc):
        assert proc.stdin is not None and proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().split()
        assert line[0] == "ready" and line[1].startswith(str(old)), line  # the old package
        versions = await cyclone_env.pool.fetch(f"SELECT version FROM {SCHEMA}.cyclone_migrations")
        assert sorted(r[0] for r in versions) == [m.version for m in MIGRATIONS if m.version <= had]
        # This migration, as this release ships it (and any before it that the old release
        # lacks), while the old worker drains.
        client._queries.migrations = tuple(
            m for m in client._queries.migrations if m.version <= migration.version
        )
        assert await client.migrate() == [
            m.version for m in MIGRATIONS if had < m.version <= migration.version
        ]
        proc.stdin.write(b"migrated\n")
        assert (await asyncio.wait_for(proc.stdout.readline(), 120)).strip() == b"drained"
        if newest:  # this release's worker beside it, on the migrated schema
            async with fast_worker(client, steps=[tick]):
                more = [await tick.enqueue(client, n) for n in range(40, 60)]
                for run in more:
                    assert await run.result(timeout=60) in range(60)
        assert proc.returncode is None  # the old worker ran through it all
        proc.stdin.write(b"stop\n")
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    counts = dict(
        await cyclone_env.pool.fetch("SELECT who, count(*) FROM rolling_ran GROUP BY who")
    )
    assert counts.get("old") == 40 if not newest else counts.get("old", 0) >= 40
    assert sum(counts.values()) == (60 if newest else 40)
