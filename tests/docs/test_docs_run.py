"""Every Python block of the guide pages and the README runs, in order, like a notebook.

Each page gets one test and one namespace: a prelude of common imports, plus ``pool``,
``client`` and ``dsn`` for the test's own throwaway database. Blocks run in page order, so a
block can use what an earlier block of the same page defined. A block with top-level
``await`` is awaited. A block preceded by ``<!-- not run: REASON -->`` is only parsed.

A ``test_*`` coroutine function defined by a block (the pages show pytest tests) is called
right after that block, with a fresh database of its own for a ``cyclone_env`` parameter.

A block preceded by ``<!-- retry-safe -->`` is run a second time right away, as a retried
request would; one preceded by ``<!-- retry-safe: CALL -->`` runs once, then the
expression CALL (which returns ``(run, created)``) is awaited twice. The first attempt must
create exactly one run and one row in each business table the block inserts into; the
retry must not raise, must change no table, and must get the same run with
``created=False``.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import sys
import traceback
import types
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from cyclone.testing.plugin import CycloneEnv, DatabaseFactory
from tests.conftest import RUN_PAGES, DocBlock, doc_blocks

PRELUDE = """\
import asyncio, contextlib, datetime as dt, logging, uuid
import asyncpg, msgspec
import cyclone
"""
SETUP = {
    # The README's taste uses the application's own orders table without showing it.
    "README.md": "CREATE TABLE orders (id bigint PRIMARY KEY, paid boolean NOT NULL DEFAULT false)",
}
"""SQL run before a page's blocks: the business tables the page uses but does not create."""
BLOCK_TIMEOUT = 60.0  # seconds for one block, with the tests it defines and its retry
INSERT_INTO = re.compile(r"INSERT INTO\s+(?:\w+\.)?(\w+)", re.IGNORECASE)


async def call_page_test(fn: Any, databases: DatabaseFactory) -> None:
    """Call a ``test_*`` function a page defines, giving it a fresh ``cyclone_env``."""
    params = list(inspect.signature(fn).parameters)
    assert set(params) <= {"cyclone_env"}, f"{fn.__name__} wants fixtures {params}"
    if not params:
        await fn()
        return
    async with databases.env() as env:
        await fn(env)


async def run_block(page: Path, block: DocBlock, ns: dict[str, Any]) -> None:
    # Leading newlines make tracebacks point at the line in the page.
    source = "\n" * (block.line - 1) + block.code
    code = compile(source, str(page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        await eval(code, ns)
    else:
        exec(code, ns)


async def table_rows(pool: asyncpg.Pool) -> dict[str, int]:
    """Rows in each table of the public schema (Cyclone's and the page's business tables)."""
    names = await pool.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )
    counts = {}
    for (name,) in names:
        quoted = '"' + name.replace('"', '""') + '"'
        counts[name] = int(await pool.fetchval(f"SELECT count(*) FROM public.{quoted}"))
    return counts


async def attempt(page: Path, block: DocBlock, ns: dict[str, Any]) -> tuple[Any, bool]:
    """One request: the block itself, or its marker's call; the ``(run, created)`` it got."""
    call = block.markers["retry-safe"]
    if not call:
        await run_block(page, block, ns)
        return ns["run"], ns["created"]
    code = compile(call, f"{page.name}: retry-safe marker", "eval")
    run, created = await eval(code, ns)
    return run, created


async def check_retry_safe(page: Path, block: DocBlock, ns: dict[str, Any]) -> None:
    """Run a retry-safe block's request twice; the second must be a harmless repeat."""
    pool = ns["pool"]
    if block.markers["retry-safe"]:
        await run_block(page, block, ns)  # defines what the call uses
    before = await table_rows(pool)
    run, created = await attempt(page, block, ns)
    first = await table_rows(pool)
    assert created is True, "the first attempt must create the run (use a fresh key)"
    assert first["cyclone_runs"] - before["cyclone_runs"] == 1, "the first attempt: one run"
    inserted = {t.lower() for t in INSERT_INTO.findall(block.code)}
    business = {t: first[t] - before[t] for t in first if not t.startswith("cyclone_")}
    assert business == {t: int(t in inserted) for t in business}, (
        f"the first attempt must write one row into each of {sorted(inserted)}: {business}"
    )
    again, created = await attempt(page, block, ns)
    assert created is False, "the retry must find the first attempt's run"
    assert again.id == run.id, "the retry must get the first attempt's run"
    assert await table_rows(pool) == first, "the retry must write nothing"


@pytest.mark.parametrize("page", RUN_PAGES, ids=[p.name for p in RUN_PAGES])
async def test_page_runs(
    page: Path,
    cyclone_env: CycloneEnv,
    cyclone_databases: DatabaseFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real module, so that anything looking up a class's module (typing, dataclasses) works.
    module = types.ModuleType(f"docs_{page.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ns = module.__dict__
    exec(PRELUDE, ns)
    ns.update(pool=cyclone_env.pool, client=cyclone_env.client, dsn=cyclone_env.dsn)
    if page.name in SETUP:
        await cyclone_env.pool.execute(SETUP[page.name])

    for block in doc_blocks(page):
        where = f"{page.name}, block at line {block.line}"
        if "not run" in block.markers:
            assert block.markers["not run"], f"{where}: say why it is not run"
            assert "retry-safe" not in block.markers, f"{where}: a retry-safe block must run"
            ast.parse(block.code, filename=where)
            continue
        before = dict(ns)
        failure = None
        try:
            async with asyncio.timeout(BLOCK_TIMEOUT):
                if "retry-safe" in block.markers:
                    await check_retry_safe(page, block, ns)
                else:
                    await run_block(page, block, ns)
                for name, value in list(ns.items()):
                    new = before.get(name) is not value
                    if new and name.startswith("test_") and inspect.iscoroutinefunction(value):
                        await call_page_test(value, cyclone_databases)
        except Exception as exc:
            failure = exc
        if failure is not None:
            # A traceback that starts in the page, not pytest's view of the whole page.
            tb = failure.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            trace = "".join(traceback.format_exception(failure.with_traceback(tb)))
            pytest.fail(f"{where} failed:\n{trace}", pytrace=False)
