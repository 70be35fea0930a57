"""Log records an operator can use: the attempt in the text, the same fields in ``extra``, a
traceback on a final failure, and the JSON recipe of docs/observability.md."""

from __future__ import annotations

import asyncio
import io
import json
import logging
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
