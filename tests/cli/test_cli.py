"""The real ``cyclone`` console script, in a subprocess, against a real database."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.metadata
import json
import os
import signal
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import cyclone
from cyclone._storage.loader import MIGRATIONS
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import backwards, echo, fail, pipeline, slow
from tests.cli.process import SCRIPT, cli, environment, one_line_error
from tests.conftest import ROOT, fast_worker, one_migration_behind, reaped

# Here, not in tests.cli.app: the CLI's workers, which import that, are not given it.
mapped = cyclone.define("cli.mapped", list[int])
mapped.node(echo, name="after", after=[mapped.map(echo, name="each")], input=lambda _, o: 0)
kid = cyclone.define_result("cli.kid", int, int)
kid.set_result(kid.node(echo, name="x"))
parented = cyclone.define("cli.parented", int)
parented.child(kid, name="k")


async def test_migrate_says_where_the_schema_is(cyclone_env: CycloneEnv) -> None:
    code, out, _ = await cli("migrate", "--help")
    assert code == 0
    first, last = MIGRATIONS[0], MIGRATIONS[-1]
    latest = f"{last.version:04d}_{last.name}"
    up_to_date = f"schema cli_schema is up to date (migration {last.version}, {latest})"
    code, out, err = await cli("--schema", "cli_schema", "migrate", dsn=cyclone_env.dsn)
    applied = f"applied {len(MIGRATIONS)} migrations, {first.version:04d}_{first.name} to {latest}"
    assert (code, out.strip()) == (0, f"{applied}; {up_to_date}"), err
    assert "[" not in out  # not a list of numbers to check for gaps
    code, out, _ = await cli("--dsn", cyclone_env.dsn, "--schema", "cli_schema", "migrate")
    assert out.strip() == f"nothing to apply; {up_to_date}"


async def test_migrate_names_what_it_applied(cyclone_env: CycloneEnv) -> None:
    """A schema one migration behind (an upgrade): migrate applies that one, by name."""
    await one_migration_behind(cyclone_env, "cli_behind")
    last = MIGRATIONS[-1]
    latest = f"{last.version:04d}_{last.name}"
    code, out, err = await cli("--schema", "cli_behind", "migrate", dsn=cyclone_env.dsn)
    assert (code, out.strip()) == (
        0,
        f"applied 1 migration, {latest}; "
        f"schema cli_behind is up to date (migration {last.version}, {latest})",
    ), err


async def test_migrate_on_a_newer_schema_says_upgrade(cyclone_env: CycloneEnv) -> None:
    await cyclone.Client(cyclone_env.pool, schema="cli_newer").migrate()
    await cyclone_env.pool.execute(
        "INSERT INTO cli_newer.cyclone_migrations (version, name) VALUES (9999, 'from_the_future')"
    )
    code, out, err = await cli("--schema", "cli_newer", "migrate", dsn=cyclone_env.dsn)
    line = one_line_error(code, err)
    assert code == 1 and out == ""
    assert "has Cyclone migrations 9999" in line and "upgrade cyclone-pg" in line


async def test_version() -> None:
    expected = importlib.metadata.version("cyclone-pg")
    assert cyclone.__version__ == expected
    code, out, err = await cli("--version")
    assert (code, out.strip()) == (0, f"cyclone-pg {expected}"), err


async def test_help_without_the_cli_extra_is_one_line(tmp_path: Path) -> None:
    # click shadowed by a package that is missing, as on an install without the extra.
    (tmp_path / "click").mkdir()
    (tmp_path / "click" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'click'\", name='click')\n"
    )
    env = environment(None)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    code, out, err = await cli("--help", env=env)
    assert (code, out) == (1, "")
    assert err.strip().splitlines() == [
        "the cyclone command needs its extra: pip install 'cyclone-pg[cli]'"
    ]


async def test_runs_ls_show_cancel_retry(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    jobs = await echo.enqueue_many(client, [1, 2, 3])
    flow = await pipeline.submit(client, 1)
    failing = await fail.enqueue(client, 7)
    async with cyclone.Worker(client, steps=[fail], poll_interval=0.05) as worker:
        assert await failing.wait(timeout=30) is cyclone.RunState.FAILED
        await worker.idle()

    code, out, err = await cli("runs", "ls", "--json", dsn=cyclone_env.dsn)
    assert code == 0, err
    listed = json.loads(out)["runs"]
    assert [r["id"] for r in listed] == sorted(
        [str(r.id) for r in [*jobs, flow, failing]], reverse=True
    )
    code, out, _ = await cli("runs", "ls", "--json", "--state", "failed", dsn=cyclone_env.dsn)
    assert [r["id"] for r in json.loads(out)["runs"]] == [str(failing.id)]
    code, out, _ = await cli("runs", "ls", "--name", "cli.pipeline", dsn=cyclone_env.dsn)
    assert str(flow.id) in out and str(jobs[0].id) not in out

    code, out, _ = await cli("runs", "show", str(flow.id), "--json", dsn=cyclone_env.dsn)
    shown = json.loads(out)
    assert [n["name"] for n in shown["nodes"]] == ["first", "second"]
    assert shown["edges"] == [["first", "second"]]
    code, out, _ = await cli("runs", "show", str(flow.id), dsn=cyclone_env.dsn)
    assert code == 0 and "first (available)" in out and "└─ second (pending)" in out
    code, out, _ = await cli("runs", "show", str(failing.id), dsn=cyclone_env.dsn)
    assert "RuntimeError: failing on purpose (7)" in out
    upside_down = await backwards.submit(client, 1)  # nodes come back child first, by name
    code, out, err = await cli("runs", "show", str(upside_down.id), dsn=cyclone_env.dsn)
    assert code == 0, err
    assert "z_parent (available)" in out and "└─ a_child (pending)" in out
    grown = await mapped.submit(client, [1, 2, 3])  # its map node's items exist at once
    code, out, err = await cli("runs", "show", str(grown.id), dsn=cyclone_env.dsn)
    assert code == 0, err
    assert "each (waiting, 0/3 items)" in out and "└─ after (pending)" in out
    assert "each[2]" in out and "each[0] (" not in out  # in the table, not the graph

    code, out, _ = await cli("runs", "cancel", str(jobs[0].id), dsn=cyclone_env.dsn)
    assert (code, out.strip()) == (0, f"cancelled {jobs[0].id}")
    assert await jobs[0].status() is cyclone.RunState.CANCELLED
    code, out, _ = await cli("runs", "retry", str(failing.id), dsn=cyclone_env.dsn)
    assert code == 0
    assert await failing.status() is cyclone.RunState.PENDING


async def test_runs_show_links_a_child_and_its_parent(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    with_kid = await parented.submit(client, 5)
    async with cyclone.Worker(client, workflows=[parented], poll_interval=0.05):
        assert await with_kid.wait(timeout=30) is cyclone.RunState.COMPLETED
    kid_id = (await with_kid.info()).nodes[0].child_run
    code, out, err = await cli("runs", "show", str(with_kid.id), dsn=cyclone_env.dsn)
    assert code == 0 and f"child of k: {kid_id}" in out, err
    code, out, err = await cli("runs", "show", str(kid_id), dsn=cyclone_env.dsn)
    assert code == 0 and f"parent: {with_kid.id} node k" in out, err


async def test_purge_and_stats(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    done = await echo.enqueue_many(client, [1, 2])
    for run in done:
        await run.cancel()
    await echo.enqueue(client, 3)
    await echo.enqueue(client, 4, process_in=3600)
    code, out, _ = await cli("stats", "--json", dsn=cyclone_env.dsn)
    assert code == 0
    [row] = json.loads(out)
    assert (row["queue"], row["available"], row["scheduled"], row["running"]) == ("cli", 1, 1, 0)
    code, out, _ = await cli("stats", dsn=cyclone_env.dsn)
    assert "cli" in out
    code, out, _ = await cli("purge", "--older-than", "0s", dsn=cyclone_env.dsn)
    assert (code, out.strip()) == (0, "purged 2 runs")
    code, _, err = await cli("purge", "--older-than", "soon", dsn=cyclone_env.dsn)
    assert "is not a duration" in one_line_error(code, err)
    code, _, err = await cli("worker", "tests.cli.app:WORK", "--queues", "cli", dsn=cyclone_env.dsn)
    assert "is not QUEUE=LIMIT" in one_line_error(code, err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs", "show", "00000000-0000-0000-0000-000000000000"], "not found"),
        (["runs", "show", "nope"], "is not a run id"),
        (["runs", "retry", "00000000-0000-0000-0000-000000000000"], "not found"),
        (["worker", "tests.cli.app:NOTHING"], "has no 'NOTHING'"),
        (["worker", "no_such_module:WORK"], "cannot import"),
        (["--schema", "Bad-Name", "runs", "ls"], "--schema must be a lower-case identifier"),
        (
            ["worker", "tests.cli.app:make_worker", "--queues", "cli=2"],
            "makes its own Worker; --queues would be ignored",
        ),
        (
            ["worker", "tests.cli.app:make_worker", "--no-claim-ahead"],
            "makes its own Worker; --no-claim-ahead would be ignored",
        ),
        (
            ["worker", "tests.cli.app:make_worker", "--lease", "60", "--claim-batch", "5"],
            "makes its own Worker; --lease, --claim-batch would be ignored",
        ),
        (["worker", "tests.cli.app:WORK", "--lease", "nan"], "lease must be"),
        (["worker", "tests.cli.app:WORK", "--lease", "0"], "lease must be a number of seconds"),
        (["worker", "tests.cli.app:WORK", "--claim-batch", "0"], "claim_batch must be an int"),
        (
            ["worker", "tests.cli.app:WORK", "--liveness-grace", "0"],
            "liveness_grace must be a number of seconds above 0",
        ),
        (
            ["worker", "tests.cli.app:make_worker", "--liveness-grace", "5"],
            "makes its own Worker; --liveness-grace would be ignored",
        ),
    ],
)
async def test_errors_are_one_line(cyclone_env: CycloneEnv, args: list[str], message: str) -> None:
    code, _, err = await cli(*args, dsn=cyclone_env.dsn)
    assert message in one_line_error(code, err)


async def test_database_problems_are_one_line() -> None:
    code, _, err = await cli("runs", "ls")
    assert "no database" in one_line_error(code, err)
    code, _, err = await cli("runs", "ls", dsn="postgresql://nobody@127.0.0.1:1/none")
    assert "cannot connect" in one_line_error(code, err)


async def start_worker(dsn: str, *options: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        SCRIPT,
        "--dsn",
        dsn,
        "worker",
        "tests.cli.app:WORK",
        "--queues",
        "cli=4",
        "--poll-interval",
        "0.1",
        *options,
        cwd=ROOT,
        env=environment(None),
        stderr=asyncio.subprocess.PIPE,
    )


async def test_worker_runs_until_a_signal(cyclone_env: CycloneEnv) -> None:
    async with reaped(await start_worker(cyclone_env.dsn, "--liveness-grace", "2.5")) as proc:
        run = await echo.enqueue(cyclone_env.client, 41)
        assert await run.result(timeout=60) == 41
        grace = await cyclone_env.pool.fetchval("SELECT grace FROM public.cyclone_workers")
        assert grace == 2.5  # what its peers wait before releasing its tasks
        flow = await pipeline.submit(cyclone_env.client, 1)
        assert await flow.wait(timeout=60) is cyclone.RunState.COMPLETED
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0


async def test_a_worker_killed_in_its_shutdown_grace_is_rescued_at_once(
    cyclone_env: CycloneEnv,
) -> None:
    """A deploy: SIGTERM, the worker waits for its running handler (up to its shutdown
    timeout), and the orchestrator's grace runs out first: SIGKILL. The handler's task is
    claimed again by a peer at once, by the liveness rescue, not after the 30 s lease."""
    started: asyncio.Queue[Any] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    await listener.add_listener("cli_started", lambda *a: started.put_nowait(a[-1]))
    run = await slow.enqueue(cyclone_env.client, 3600.0)
    try:
        async with reaped(await start_worker(cyclone_env.dsn, "--shutdown-timeout", "600")) as proc:
            await asyncio.wait_for(started.get(), 60)
            async with fast_worker(cyclone_env.client, steps=[slow], lease=30.0) as peer:
                proc.send_signal(signal.SIGTERM)
                assert proc.stderr is not None
                while b"stopping gracefully" not in await asyncio.wait_for(
                    proc.stderr.readline(), 60
                ):
                    pass
                proc.send_signal(signal.SIGKILL)
                assert await proc.wait() == -signal.SIGKILL
                # Well inside the 30 s lease: the peer runs attempt 2.
                assert await asyncio.wait_for(started.get(), 20) == str(run.id)
                peer.hurry()
    finally:
        await listener.close()
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost"


async def test_second_signal_stops_at_once(cyclone_env: CycloneEnv) -> None:
    started: asyncio.Queue[Any] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    await listener.add_listener("cli_started", lambda *a: started.put_nowait(a[-1]))
    run = await slow.enqueue(cyclone_env.client, 3600.0)
    try:
        async with reaped(await start_worker(cyclone_env.dsn)) as proc:
            await asyncio.wait_for(started.get(), 60)
            proc.send_signal(signal.SIGINT)  # graceful: would wait for the hour-long handler
            assert proc.stderr is not None
            while True:
                line = await asyncio.wait_for(proc.stderr.readline(), 60)
                assert line, "the worker exited before it began stopping gracefully"
                if b"stopping gracefully" in line:
                    break
            assert line.decode().strip() == (
                "cyclone: stopping gracefully: running handlers get up to 30 s to finish, "
                "then they are cancelled (again to stop now)"
            )
            proc.send_signal(signal.SIGINT)  # now
            assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await listener.close()
    info = await run.info()
    assert (info.state, info.nodes[0].state, info.nodes[0].attempts) == (
        cyclone.RunState.PENDING,
        "available",
        0,
    )  # given back for another worker


@pytest.mark.parametrize("claim_ahead", [True, False])
async def test_no_claim_ahead_claims_only_for_free_slots(
    cyclone_env: CycloneEnv, claim_ahead: bool
) -> None:
    """Two slots, short handlers so far, then four hour-long ones: by default the worker
    claims all four (two wait in it for a slot); with --no-claim-ahead the two without a
    slot stay available for other workers."""
    started: asyncio.Queue[Any] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    await listener.add_listener("cli_started", lambda *a: started.put_nowait(a[-1]))
    options = ["--queues", "cli=2", "--shutdown-timeout", "0.1"]
    try:
        async with reaped(
            await start_worker(
                cyclone_env.dsn, *options, *([] if claim_ahead else ["--no-claim-ahead"])
            )
        ) as proc:
            assert await (await echo.enqueue(cyclone_env.client, 1)).result(timeout=60) == 1
            await slow.enqueue_many(cyclone_env.client, [3600.0] * 4)
            for _ in range(2):
                await asyncio.wait_for(started.get(), 60)

            async def running() -> int:
                n: int = await cyclone_env.pool.fetchval(
                    "SELECT count(*) FROM cyclone_tasks WHERE state = 'running'"
                )
                return n

            if claim_ahead:
                async with asyncio.timeout(60):
                    while await running() < 4:  # noqa: ASYNC110 - another process's claims
                        await asyncio.sleep(0.05)
            else:
                # A negative: give the worker a few polls (every 0.1 s) to claim more.
                await asyncio.sleep(1.0)
                assert await running() == 2
            assert started.empty()  # never more handlers than slots
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await listener.close()


async def test_lease_and_claim_batch_reach_the_worker(cyclone_env: CycloneEnv) -> None:
    """Four hour-long jobs, available at once, for four slots: claims of one task each start
    them at four different times (one claim would start all four at its own), and each
    lease runs out --lease seconds after its claim."""
    started: asyncio.Queue[Any] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    await listener.add_listener("cli_started", lambda *a: started.put_nowait(a[-1]))
    options = ["--claim-batch", "1", "--lease", "600", "--shutdown-timeout", "0.1"]
    try:
        async with reaped(await start_worker(cyclone_env.dsn, *options)) as proc:
            await slow.enqueue_many(cyclone_env.client, [3600.0] * 4)
            for _ in range(4):
                await asyncio.wait_for(started.get(), 60)
            row = await cyclone_env.pool.fetchrow(
                "SELECT count(DISTINCT started_at) AS starts,"
                " array_agg(DISTINCT lease_until - started_at) AS leases"
                " FROM cyclone_tasks WHERE state = 'running'"
            )
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await listener.close()
    assert row["starts"] == 4
    assert row["leases"] == [dt.timedelta(seconds=600)]  # no heartbeat yet: every lease / 3


async def test_dev_db_serves_until_interrupted() -> None:
    proc = await asyncio.create_subprocess_exec(
        SCRIPT,
        "dev-db",
        env=environment(None),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    async with reaped(proc):
        assert proc.stdout is not None
        dsn = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
        conn = await asyncpg.connect(dsn)
        assert await conn.fetchval("SELECT 1") == 1
        await conn.close()
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 0


async def test_migrate_check_lists_what_the_schema_lacks_and_exits_1(
    cyclone_env: CycloneEnv,
) -> None:
    """For a deploy pipeline: nothing is applied; exit 1 while migrations are pending."""
    code, out, err = await cli("--schema", "cli_check", "migrate", "--check", dsn=cyclone_env.dsn)
    line = one_line_error(code, err)
    assert code == 1 and out == ""
    assert f"schema cli_check lacks {len(MIGRATIONS)} migrations: 0001_init" in line
    assert "run `cyclone migrate`" in line
    tables = await cyclone_env.pool.fetchval(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'cli_check'"
    )
    assert tables == 0  # applied nothing
    await cyclone.Client(cyclone_env.pool, schema="cli_check").migrate()
    code, out, err = await cli("--schema", "cli_check", "migrate", "--check", dsn=cyclone_env.dsn)
    last = MIGRATIONS[-1]
    assert (code, out.strip()) == (
        0,
        f"schema cli_check is up to date (migration {last.version}, "
        f"{last.version:04d}_{last.name})",
    ), err
    await cyclone_env.pool.execute(
        "INSERT INTO cli_check.cyclone_migrations (version, name) VALUES (9999, 'from_the_future')"
    )
    code, _, err = await cli("--schema", "cli_check", "migrate", "--check", dsn=cyclone_env.dsn)
    assert code == 1 and "upgrade cyclone-pg" in one_line_error(code, err)
