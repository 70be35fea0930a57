"""Plain def steps for ``cyclone worker --processes``: ``tests.cli.sync_app:WORK``."""

from __future__ import annotations

import os
import time

import anyio.from_thread

import cyclone

# The test holds this advisory lock while the handlers must stay inside.
HOLD_LOCK = 4242


@cyclone.step("cli.sync.hold", queue="cli_sync")
def hold(ctx: cyclone.Context, n: int) -> int:
    """Says which process runs it, then blocks (its thread) until the test lets go."""
    pool = ctx.client.pool
    who = f"{os.getpid()} {ctx.run_id} {ctx.attempt}"
    anyio.from_thread.run(pool.execute, "SELECT pg_notify('cli_sync_started', $1)", who)
    anyio.from_thread.run(pool.execute, f"SELECT pg_advisory_xact_lock_shared({HOLD_LOCK})")
    return n


@cyclone.step("cli.sync.stuck", queue="cli_sync")
def stuck(ctx: cyclone.Context, seconds: float) -> float:
    """Says it started, then blocks its thread in plain Python, deaf to everything."""
    who = f"{os.getpid()} {ctx.run_id} {ctx.attempt}"
    anyio.from_thread.run(ctx.client.pool.execute, "SELECT pg_notify('cli_sync_started', $1)", who)
    time.sleep(seconds)
    return seconds


WORK = [hold, stuck]
