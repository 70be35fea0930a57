"""Invalid keys never reach the database: property-based against a real connection."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows, recording_queries


@cyclone.step("keyed")
async def keyed(ctx: cyclone.Context, n: int) -> int:
    return n


keyed_flow = cyclone.define("keyed.flow", int)
keyed_flow.node(keyed)

invalid_keys = (
    st.just("")
    | st.text(min_size=1, max_size=20).map(lambda s: s[:10] + "\x00" + s[10:])
    | st.text(max_size=20).map(lambda s: s + "\udc80")
    | st.text(alphabet="aé😀", min_size=65, max_size=300).filter(lambda s: len(s.encode()) > 256)
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=invalid_keys)
async def test_invalid_keys_send_no_sql(cyclone_env: CycloneEnv, key: str) -> None:
    async with (
        cyclone_env.pool.acquire() as conn,
        recording_queries(conn) as sent,
        conn.transaction(),
    ):
        with pytest.raises(cyclone.InvalidKeyError):
            await keyed.enqueue_tx(cyclone_env.client, conn, 1, unique=key)
        with pytest.raises(cyclone.InvalidKeyError):
            await keyed.enqueue_tx(cyclone_env.client, conn, 1, sequence=key)
        with pytest.raises(cyclone.InvalidKeyError):
            await keyed_flow.submit_once_tx(cyclone_env.client, conn, key, 1)
    assert sent == []
    assert await count_rows(cyclone_env, "cyclone_runs") == 0
