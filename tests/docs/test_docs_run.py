"""Every Python block of the guide pages runs, in order, like a notebook.

Each page gets one test and one namespace: a prelude of common imports, plus ``pool``,
``client`` and ``dsn`` for the test's own throwaway database. Blocks run in page order, so a
block can use what an earlier block of the same page defined. A block with top-level
``await`` is awaited. A block preceded by ``<!-- not run: REASON -->`` is only parsed.

A ``test_*`` coroutine function defined by a block (the pages show pytest tests) is called
right after that block, with a fresh database of its own for a ``cyclone_env`` parameter.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cyclone.testing.plugin import CycloneEnv, DatabaseFactory
from tests.conftest import PYTHON_BLOCK, ROOT

NOT_RUN_PAGES = {"performance.md", "reference.md"}
PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in NOT_RUN_PAGES)
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->")
PRELUDE = """\
import asyncio, contextlib, datetime as dt, logging, uuid
import asyncpg, msgspec
import cyclone
"""
BLOCK_TIMEOUT = 60.0  # seconds for one block, with the tests it defines


@dataclass(frozen=True)
class Block:
    line: int  # of the block's first line of code, in the page
    code: str
    not_run: str | None  # the reason, for a block that is only parsed


def blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, each with the reason it is not run, if it is not."""
    text = page.read_text()
    found = []
    for match in PYTHON_BLOCK.finditer(text):
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1]
        marker = NOT_RUN.fullmatch(before.strip())
        found.append(
            Block(
                line=text.count("\n", 0, match.start(1)) + 1,
                code=match[1],
                not_run=marker[1].strip() if marker else None,
            )
        )
    markers = len(NOT_RUN.findall(text))
    assert markers == sum(b.not_run is not None for b in found), (
        f"{page.name}: a <!-- not run: ... --> marker must be the line right before a block"
    )
    return found


async def call_page_test(fn: Any, databases: DatabaseFactory) -> None:
    """Call a ``test_*`` function a page defines, giving it a fresh ``cyclone_env``."""
    params = list(inspect.signature(fn).parameters)
    assert set(params) <= {"cyclone_env"}, f"{fn.__name__} wants fixtures {params}"
    if not params:
        await fn()
        return
    async with databases.env() as env:
        await fn(env)


async def run_block(page: Path, block: Block, ns: dict[str, Any]) -> None:
    # Leading newlines make tracebacks point at the line in the page.
    source = "\n" * (block.line - 1) + block.code
    code = compile(source, str(page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        await eval(code, ns)
    else:
        exec(code, ns)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
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

    for block in blocks(page):
        where = f"{page.name}, block at line {block.line}"
        if block.not_run is not None:
            assert block.not_run, f"{where}: say why it is not run"
            ast.parse(block.code, filename=where)
            continue
        before = dict(ns)
        failure = None
        try:
            async with asyncio.timeout(BLOCK_TIMEOUT):
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
