"""``cyclone runs``: input and output, signals, pages; output for pipes; dev-db's DSN."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import uuid

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import approval, echo, pipeline
from tests.cli.process import SCRIPT, cli, environment, one_line_error
from tests.conftest import fast_worker, reaped, released_by_a_peer


async def test_show_has_input_and_output(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run = await echo.enqueue(client, 41)
    flow = await pipeline.submit(client, 2)
    async with fast_worker(client, steps=[echo]):
        assert await run.result(timeout=60) == 41
    code, out, err = await cli("runs", "show", str(run.id), "--json", dsn=cyclone_env.dsn)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["input"], shown["output"]) == (41, 41)
    code, out, _ = await cli("runs", "show", str(run.id), dsn=cyclone_env.dsn)
    assert "input: 41\noutput: 41\n" in out
    code, out, _ = await cli("runs", "show", str(flow.id), dsn=cyclone_env.dsn)
    assert "input: 2\noutput: null\n" in out  # no result node, so no output


branchy = cyclone.define("cli.branchy", int)
branchy.node(echo, name="then", after=[branchy.node(echo, name="first").when(7)])


async def test_show_has_branch_values(cyclone_env: CycloneEnv) -> None:
    run = await branchy.submit(cyclone_env.client, 7)
    code, out, err = await cli("runs", "show", str(run.id), dsn=cyclone_env.dsn)
    assert code == 0, err
    assert "branch: first -> then when first is 7\n" in out
    code, out, err = await cli("runs", "show", str(run.id), "--json", dsn=cyclone_env.dsn)
    assert json.loads(out)["branches"] == [["first", "then", 7]]


async def test_signal(cyclone_env: CycloneEnv) -> None:
    run = await approval.submit(cyclone_env.client, 1)
    rid = str(run.id)
    code, _, err = await cli(
        "runs", "signal", rid, "approve", "--payload", "{ok}", dsn=cyclone_env.dsn
    )
    assert one_line_error(code, err).startswith("cyclone: --payload is not JSON (")
    code, _, err = await cli("runs", "signal", rid, "nope", dsn=cyclone_env.dsn)
    assert one_line_error(code, err) == f"cyclone: run {rid} has no node 'nope'"
    payload = '{"approved": true, "by": "ops"}'
    code, out, err = await cli(
        "runs", "signal", rid, "approve", "--payload", payload, dsn=cyclone_env.dsn
    )
    assert (code, out.strip()) == (0, f"signalled approve of run {rid}"), err
    assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    output = await cyclone_env.pool.fetchval(
        "SELECT output::text FROM cyclone_steps WHERE run_id = $1 AND node = 'approve'", run.id
    )
    assert json.loads(output) == {"approved": True, "by": "ops"}


async def test_ls_pages_with_a_cursor(cyclone_env: CycloneEnv) -> None:
    runs = await echo.enqueue_many(cyclone_env.client, [1, 2, 3])
    newest_first = [str(r.id) for r in reversed(runs)]
    code, out, err = await cli("runs", "ls", "--limit", "2", "--json", dsn=cyclone_env.dsn)
    assert code == 0, err
    page = json.loads(out)
    assert [r["id"] for r in page["runs"]] == newest_first[:2]
    assert page["next_cursor"] == newest_first[1]
    code, out, _ = await cli("runs", "ls", "--limit", "2", dsn=cyclone_env.dsn)
    assert f"next page: --cursor {newest_first[1]}" in out
    args = ("runs", "ls", "--limit", "2", "--cursor", page["next_cursor"], "--json")
    code, out, _ = await cli(*args, dsn=cyclone_env.dsn)
    page = json.loads(out)
    assert ([r["id"] for r in page["runs"]], page["next_cursor"]) == (newest_first[2:], None)
    code, _, err = await cli("runs", "ls", "--cursor", "nope", dsn=cyclone_env.dsn)
    assert one_line_error(code, err) == "cyclone: not a cursor from list_runs: 'nope'"


async def test_ls_filters_by_queue(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    here = await echo.enqueue(client, 1)
    there = await echo.enqueue(client, 2, queue="elsewhere")
    flow = await pipeline.submit(client, 3)  # its nodes are on the step's queue, cli
    code, out, err = await cli("runs", "ls", "--queue", "elsewhere", "--json", dsn=cyclone_env.dsn)
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)["runs"]] == [str(there.id)]
    code, out, err = await cli("runs", "ls", "--queue", "cli", "--json", dsn=cyclone_env.dsn)
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)["runs"]] == [str(flow.id), str(here.id)]
    code, out, err = await cli("runs", "ls", "--queue", "nobody", dsn=cyclone_env.dsn)
    assert code == 0 and str(here.id) not in out and str(there.id) not in out, err


async def test_show_leaves_out_an_absent_key(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    plain = await echo.enqueue(client, 1)
    keyed, _ = await pipeline.submit_once(client, "order-7", 2)
    code, out, err = await cli("runs", "show", str(plain.id), dsn=cyclone_env.dsn)
    assert code == 0, err
    assert "None" not in out and "key" not in out
    assert out.splitlines()[:2] == [f"cli.echo {plain.id}  pending", "input: 1"]
    code, out, err = await cli("runs", "show", str(keyed.id), dsn=cyclone_env.dsn)
    assert code == 0, err
    assert out.splitlines()[:3] == [f"cli.pipeline {keyed.id}  pending", "key: order-7", "input: 2"]


async def test_tables_are_not_cut_when_piped(cyclone_env: CycloneEnv) -> None:
    key = "order-" + "x" * 120
    run, _ = await pipeline.submit_once(cyclone_env.client, key, 1)
    # A shell's COLUMNS reaches a pipe too: values are whole all the same, a field each.
    env = environment(cyclone_env.dsn) | {"COLUMNS": "40"}
    code, out, err = await cli("runs", "ls", env=env)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split("\t") == ["id", "name", "state", "key", "created"]
    [row] = [line.split("\t") for line in rows if str(run.id) in line]
    assert row[:4] == [str(run.id), "cli.pipeline", "pending", key]


async def test_dev_db_uses_the_database_url(cyclone_env: CycloneEnv) -> None:
    proc = await asyncio.create_subprocess_exec(
        SCRIPT,
        "dev-db",
        env=environment(cyclone_env.dsn),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with reaped(proc):
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert line.decode().strip() == cyclone_env.dsn
        note = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert b"CYCLONE_DATABASE_URL" in note and b"leaves it running" in note
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert await cyclone_env.pool.fetchval("SELECT 1") == 1  # the server was left alone


async def test_why_says_what_holds_each_node(cyclone_env: CycloneEnv) -> None:
    job = await echo.enqueue(cyclone_env.client, 1)
    code, out, err = await cli("runs", "why", str(job.id), dsn=cyclone_env.dsn)
    assert code == 0, err
    assert out.startswith(f"{job.id}  pending\n")
    assert "cli.echo (no_worker): No live worker serves it" in out
    flow = await approval.submit(cyclone_env.client, 1)
    code, out, err = await cli("runs", "why", str(flow.id), "--json", dsn=cyclone_env.dsn)
    assert code == 0, err
    explained = json.loads(out)
    assert explained["state"] == "pending"
    [reason] = explained["reasons"]
    assert (reason["node"], reason["code"]) == ("approve", "waiting_for_signal")
    assert "client.signal(run_id, 'approve', payload)" in reason["message"]
    await job.cancel()
    code, out, _ = await cli("runs", "why", str(job.id), dsn=cyclone_env.dsn)
    assert code == 0 and "The run was cancelled at" in out
    code, _, err = await cli("runs", "why", str(uuid.UUID(int=1)), dsn=cyclone_env.dsn)
    assert one_line_error(code, err) == f"cyclone: run {uuid.UUID(int=1)} not found"


async def test_show_says_who_released_an_attempt(cyclone_env: CycloneEnv) -> None:
    run = await echo.enqueue(cyclone_env.client, 3)
    await released_by_a_peer(cyclone_env, run)
    code, out, err = await cli("runs", "show", str(run.id), dsn=cyclone_env.dsn)
    assert code == 0, err
    line = next(line for line in out.splitlines() if "released by" in line)
    assert line.startswith("cli.echo attempt 1 worker lost: released by peer-1 at ")
    assert "worker gone-1 (host h, pid 1)" in line and "last heartbeat " in line


async def test_ls_and_purge_know_expired_runs(cyclone_env: CycloneEnv) -> None:
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    expired = await echo.enqueue(cyclone_env.client, 1, expires_at=past)
    await echo.enqueue(cyclone_env.client, 2)
    await fast_worker(cyclone_env.client, steps=[echo]).maintain_once()  # ends the expired one
    assert await expired.status() is cyclone.RunState.EXPIRED
    code, out, err = await cli("runs", "ls", "--state", "expired", "--json", dsn=cyclone_env.dsn)
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)["runs"]] == [str(expired.id)]
    code, out, err = await cli(
        "purge", "--older-than", "0s", "--state", "expired", dsn=cyclone_env.dsn
    )
    assert code == 0, err
    assert await cyclone_env.pool.fetchval("SELECT array_agg(state) FROM cyclone_runs") == [
        "pending"
    ]
