"""A few minutes of steady mixed load with the retention sweeper on (benchmarks.soak): nothing
is lost, every run ends as its planned failures say, and once retention runs the tables stop
growing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.soak import TABLES, Soak, render, soak
from cyclone.testing import postgres_server

# Autovacuum wakes every 2 s instead of every minute, so that a few minutes hold several of
# its rounds: the plateau a long run shows after its first vacuums, in CI time.
SETTINGS = {"autovacuum_naptime": "2s"}
RETENTION = 10.0
MINUTES = 2.5
GROWTH = 1.25  # largest total size, second half of the steady state over the first half


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    """A server of the soak's own (never CYCLONE_TEST_DSN's: it needs its settings)."""
    with postgres_server(env_var="CYCLONE_SOAK_DSN", settings=SETTINGS) as server:
        yield server.dsn


@pytest.mark.timeout(600)
async def test_soak_loses_nothing_and_sizes_plateau(dsn: str) -> None:
    result: Soak = await soak(dsn, seconds=MINUTES * 60, every=5.0, rate=60.0, retention=RETENTION)
    print(render(result))
    assert result.submitted > 1000
    assert result.lost == [], f"runs without an outcome: {result.lost[:20]}"
    assert result.wrong == [], (
        f"runs with an outcome their planned failures contradict: {result.wrong[:20]}"
    )
    assert result.pending_left == 0
    assert result.repeats > 0 and result.wrong_repeats == 0
    assert result.first_purge is not None, "the retention sweeper never purged a run"
    growth = result.growth()
    last = result.samples[-1]
    sizes = {t: last.heap[t] + last.indexes[t] for t in TABLES}
    assert growth <= GROWTH, (
        f"tables kept growing after the first retention pass: {growth:.2f}, {sizes}"
    )
