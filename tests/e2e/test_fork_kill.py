"""A fork whose first re-run node's worker is SIGKILLed mid-handler completes once on another
worker process, with the outputs it copied intact."""

from __future__ import annotations

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.e2e.test_kill import kill_mid_step_then_rescue, make_tables
from tests.e2e.worker_app import flow


async def test_a_fork_killed_mid_rerun_completes_once(cyclone_env: CycloneEnv) -> None:
    await make_tables(cyclone_env)
    run = await flow.submit(cyclone_env.client, 4)
    await kill_mid_step_then_rescue(cyclone_env, run)  # the source: charge's attempt 2 charged
    fork = await cyclone_env.client.fork(run, from_node="charge")
    # The fork's charge starts at attempt 1 again: its worker is killed inside it, and a
    # second worker process claims it and completes the fork.
    await kill_mid_step_then_rescue(cyclone_env, fork)
    assert await cyclone.ResultRun(cyclone_env.client, fork.id, str).result() == (
        "shipped after charged 4"
    )
    started = await cyclone_env.pool.fetch("SELECT attempt FROM started ORDER BY attempt")
    assert [r["attempt"] for r in started] == [1, 1, 2, 2]  # charge: 1 (killed), 2 in each run
    charges = await cyclone_env.pool.fetch("SELECT order_id, attempt FROM charges")
    assert sorted(tuple(r) for r in charges) == [(4, 2), (4, 2)]  # once per run
    nodes = {n.name: (n.state, n.attempts) for n in (await fork.info()).nodes}
    assert nodes == {
        "e2e.prepare": ("completed", 1),  # copied
        "charge": ("completed", 2),
        "e2e.ship": ("completed", 1),
    }
    assert (await fork.payloads()).nodes["e2e.prepare"].output == 4
    assert (await fork.info()).forked_from == (run.id, "charge")
