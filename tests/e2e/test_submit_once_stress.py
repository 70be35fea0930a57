"""8 processes x 50 coroutines submit the same 20 keys: exactly one run per key."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import msgspec

from cyclone.testing.plugin import CycloneEnv
from tests.conftest import python_module
from tests.e2e.submit_once_app import CONFLICTING, KEYS

PROCESSES = 8


async def run_process(dsn: str, process: int) -> list[dict[str, object]]:
    proc = await python_module(
        "tests.e2e.submit_once_app", dsn, process, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    return [json.loads(line) for line in out.decode().splitlines()]


async def test_concurrent_submit_once_from_many_processes(cyclone_env: CycloneEnv) -> None:
    batches = await asyncio.wait_for(
        asyncio.gather(*(run_process(cyclone_env.dsn, p) for p in range(PROCESSES))), 300
    )
    records = [r for batch in batches for r in batch]
    assert len(records) == PROCESSES * 50 * len(KEYS)

    rows = await cyclone_env.pool.fetch(
        "SELECT key, id, input::text AS input FROM cyclone_runs WHERE name = 'stress'"
    )
    assert sorted(r["key"] for r in rows) == sorted(KEYS)  # exactly one run per key
    stored = {r["key"]: (str(r["id"]), msgspec.json.decode(r["input"])["variant"]) for r in rows}

    created = defaultdict(int)
    for r in records:
        run_id, stored_variant = stored[r["key"]]
        assert r["run_id"] == run_id  # every caller got the key's run
        if r["variant"] == stored_variant:
            assert r["outcome"] in ("created", "existing")
        else:
            assert r["outcome"] == "conflict"  # exactly the differing inputs conflict
            assert r["key"] in CONFLICTING
        created[r["key"]] += r["outcome"] == "created"
        assert r.get("tx_usable", True)  # no transaction was left aborted
    assert dict(created) == {key: 1 for key in KEYS}
    conflicts = sum(r["outcome"] == "conflict" for r in records)
    assert conflicts == PROCESSES // 2 * 50 * len(CONFLICTING)
