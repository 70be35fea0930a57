"""Log records an operator can use: the attempt in the text, the same fields in ``extra``, a
traceback on a final failure, and the JSON recipe of docs/observability.md."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from typing import Any

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import PYTHON_BLOCK, ROOT, Records

FIELDS = ("run_id", "kind", "node", "attempt", "max_attempts", "queue", "worker")


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return {f: getattr(record, f, "missing") for f in FIELDS}


calls: dict[int, int] = {}


@cyclone.step("logs.flaky", queue="logs", max_attempts=2)
async def flaky(ctx: cyclone.Context, n: int) -> int:
    calls[n] = calls.get(n, 0) + 1
    if n < 0 or calls[n] == 1:
        raise ValueError(f"boom {n}")
    return n


pipeline = cyclone.define("logs.pipeline", int)
pipeline.node(flaky, name="first")


async def test_a_retry_names_the_attempt(cyclone_env: CycloneEnv, records: Records) -> None:
    calls.clear()
    run = await flaky.enqueue(cyclone_env.client, 1)
    worker = cyclone_env.worker(steps=[flaky], workflows=[pipeline], backoff=lambda a: 0.25)
    async with worker:
        assert await run.result(timeout=30) == 1
    record = await records.first(r"attempt 1/2 of logs\.flaky .*")
    assert record.getMessage() == (
        f"attempt 1/2 of logs.flaky (run {run.id}) failed: ValueError: boom 1; retrying in 0.25 s"
    )
    assert record.levelno == logging.WARNING
    assert fields(record) == {
        "run_id": str(run.id),
        "kind": "logs.flaky",
        "node": None,
        "attempt": 1,
        "max_attempts": 2,
        "queue": "logs",
        "worker": worker.id,
    }
    assert "cyclone:" not in record.getMessage()  # the logger's name is the formatter's job


async def test_a_final_failure_carries_its_traceback(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    run = await pipeline.submit(cyclone_env.client, -3)
    async with cyclone_env.worker(workflows=[pipeline], backoff=lambda a: 0):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    record = await records.first(r"attempt 2/2 .*")
    assert record.getMessage() == (
        f"attempt 2/2 of logs.flaky (run {run.id}, node first) failed: ValueError: boom -3; "
        "no attempts left, so the run fails"
    )
    assert record.levelno == logging.ERROR
    assert fields(record)["node"] == "first" and fields(record)["attempt"] == 2
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert 'raise ValueError(f"boom {n}")' in logging.Formatter().format(record)


settling = cyclone.define("logs.settling", list[int])
settling.map(flaky, name="each", settle=True)


async def test_a_settled_item_says_its_run_goes_on(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    run = await settling.submit(cyclone_env.client, [-4])
    async with cyclone_env.worker(workflows=[settling], backoff=lambda a: 0):
        assert await run.wait(timeout=30) is cyclone.RunState.COMPLETED
    record = await records.first(r"attempt 2/2 .*")
    assert record.getMessage() == (
        f"attempt 2/2 of logs.flaky (run {run.id}, node each[0]) failed: ValueError: boom -4; "
        "no attempts left, and its map node settles it, so the run goes on"
    )
    assert record.levelno == logging.WARNING


started = asyncio.Event()


@cyclone.step("logs.stuck", queue="logs")
async def stuck(ctx: cyclone.Context, n: int) -> None:
    started.set()
    await asyncio.Event().wait()  # until the worker cancels it


async def test_a_lost_lease_is_a_warning_that_names_the_attempt(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    started.clear()
    run = await stuck.enqueue(cyclone_env.client, 1)
    async with cyclone_env.worker(steps=[stuck], heartbeat=0.1) as worker:
        await asyncio.wait_for(started.wait(), 30)
        # As if the lease had run out and another worker had claimed the task meanwhile.
        await cyclone_env.pool.execute(
            "UPDATE cyclone_tasks SET claims = claims + 1 WHERE run_id = $1", run.id
        )
        record = await records.first(r".* lost its lease: .*")
        await worker.idle()
    assert record.getMessage().startswith(
        f"attempt 1/{stuck.max_attempts} of logs.stuck (run {run.id}) lost its lease: it ran "
        "out before this worker renewed it"
    )
    assert record.levelno == logging.WARNING
    assert fields(record)["run_id"] == str(run.id) and fields(record)["worker"] == worker.id


async def test_a_reclaim_names_the_attempt_and_the_worker(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    run = await flaky.enqueue(cyclone_env.client, 5)
    await cyclone_env.pool.execute(
        "UPDATE cyclone_tasks SET state = 'running', attempt = 1, worker = 'gone',"
        " lease_until = now() - interval '1 hour' WHERE run_id = $1",
        run.id,
    )
    await cyclone_env.worker(steps=[flaky]).maintain_once()
    record = await records.first(r".*its lease expired.*")
    assert record.getMessage() == (
        f"attempt 1/2 of logs.flaky (run {run.id}): its lease expired (worker gone stopped "
        "renewing it); it is available again"
    )
    assert fields(record)["kind"] == "logs.flaky" and fields(record)["queue"] == "logs"


# The held handler's events, made anew by each test in its own event loop.
gate: dict[str, asyncio.Event] = {}


@cyclone.step("logs.held", queue="logs")
async def held(ctx: cyclone.Context, n: int) -> int:
    gate["started"].set()
    await gate["released"].wait()  # until the test releases it, or the worker cancels it
    return n


async def start_held(
    cyclone_env: CycloneEnv, n: int, timeout: float
) -> tuple[cyclone.ResultRun[int], cyclone.Worker]:
    """A worker with a shutdown timeout of ``timeout``, running a held handler."""
    gate.update(started=asyncio.Event(), released=asyncio.Event())
    run = await held.enqueue(cyclone_env.client, n)
    worker = cyclone_env.worker(steps=[held], shutdown_timeout=timeout)
    await worker.start()
    await asyncio.wait_for(gate["started"].wait(), 30)
    return run, worker


async def test_a_graceful_stop_says_what_it_waits_for_and_that_they_finished(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    run, worker = await start_held(cyclone_env, 4, 120)
    stopping = asyncio.create_task(worker.stop())
    try:
        begins = await records.first(r"worker .* stopping: .*")
        assert not stopping.done()  # it waits for the handler
        gate["released"].set()
    finally:
        await asyncio.wait_for(stopping, 60)
    assert await run.result(timeout=30) == 4
    assert begins.getMessage() == (
        f"worker {worker.id} stopping: 1 handler running; waiting up to 120 s for them to "
        "finish, then cancelling the rest"
    )
    assert begins.levelno == logging.INFO
    extra = [getattr(begins, f) for f in ("worker", "running", "shutdown_timeout")]
    assert extra == [worker.id, 1, 120]
    ended = await records.first(rf"worker {re.escape(worker.id)}: 1 handler finished in \d+\.\d s")
    assert ended.levelno == logging.INFO
    assert not records.messages("still running")


async def test_a_graceful_stop_says_it_cancels_at_the_deadline(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    run, worker = await start_held(cyclone_env, 2, 0.2)
    await worker.stop()  # the handler never returns: cancelled at the deadline
    assert records.messages("stopping: ") == [
        f"worker {worker.id} stopping: 1 handler running; waiting up to 0.2 s for them to "
        "finish, then cancelling the rest"
    ]
    cancelled = await records.first(r".* still running .*")
    assert cancelled.getMessage() == (
        f"worker {worker.id}: 1 of 1 handler still running after 0.2 s; cancelling them, "
        "their tasks are given back for any worker to claim"
    )
    assert cancelled.levelno == logging.WARNING
    assert not records.messages("finished in")
    info = await run.info()
    assert (info.nodes[0].state, info.nodes[0].attempts) == ("available", 0)  # given back


async def test_a_stop_with_nothing_running_says_so(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    async with cyclone_env.worker(steps=[held]) as worker:
        pass
    assert records.messages("stopping") == [f"worker {worker.id} stopping: no handlers running"]


def recipe() -> dict[str, Any]:
    """The JSON formatter of docs/observability.md, executed."""
    page = (ROOT / "docs" / "observability.md").read_text()
    [code] = [m[1] for m in PYTHON_BLOCK.finditer(page) if "class JsonFormatter" in m[1]]
    namespace: dict[str, Any] = {}
    exec(compile(code, "observability.md", "exec"), namespace)
    return namespace


async def test_the_json_logging_recipe(cyclone_env: CycloneEnv) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(recipe()["JsonFormatter"]())
    logger = logging.getLogger("cyclone")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        run = await pipeline.submit(cyclone_env.client, -8)
        async with cyclone_env.worker(workflows=[pipeline], backoff=lambda a: 0) as worker:
            assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    [final] = [e for e in lines if e["level"] == "ERROR"]
    assert {k: final[k] for k in FIELDS} == {
        "run_id": str(run.id),
        "kind": "logs.flaky",
        "node": "first",
        "attempt": 2,
        "max_attempts": 2,
        "queue": "logs",
        "worker": worker.id,
    }
    assert final["logger"] == "cyclone" and final["message"].startswith("attempt 2/2 of")
    assert "ValueError: boom -8" in final["traceback"]
    assert any(e["message"].startswith(f"worker {worker.id} started") for e in lines)
