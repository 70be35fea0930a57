"""Claims of the guides that their snippets cannot show on every query plan."""

from __future__ import annotations

import asyncpg

import cyclone
from cyclone.testing.plugin import CycloneEnv


@cyclone.action("claims.zz")
async def last(ctx: cyclone.Context, n: int) -> None: ...


@cyclone.action("claims.aa")
async def first(ctx: cyclone.Context, n: int) -> None: ...


# Defined (and so inserted) out of name order: mm, then claims.zz, then bb.
unsorted = cyclone.define("claims.unsorted", int)
unsorted.node(last, after=[unsorted.node(first, name="mm")])
unsorted.node(first, name="bb")


async def test_run_info_lists_nodes_by_name_whatever_the_plan(cyclone_env: CycloneEnv) -> None:
    """workflows.md: `nodes` is sorted by name. Without index scans, PostgreSQL reads the
    steps in the order they were inserted, so only an ORDER BY sorts them."""
    plain_scans = {"enable_indexscan": "off", "enable_bitmapscan": "off"}
    async with asyncpg.create_pool(
        cyclone_env.dsn, min_size=1, max_size=2, server_settings=plain_scans
    ) as pool:
        client = cyclone.Client(pool)
        run = await unsorted.submit(client, 1)
        info = await run.info()
        await client.aclose()
    assert [node.name for node in info.nodes] == ["bb", "claims.zz", "mm"]
