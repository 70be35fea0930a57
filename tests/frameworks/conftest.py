"""Shared pieces of the integration tests: a business table, a job kind and a workflow,
and synchronous observers (a psycopg LISTEN connection, a lock waiter) for sync tests."""

from __future__ import annotations

import select
import time
from collections import Counter
from collections.abc import Iterator

import msgspec
import psycopg
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv


class Order(msgspec.Struct):
    ref: str


ship = cyclone.register_kind("integrations.ship", Order, None, queue="ship")
audit = cyclone.register_kind("integrations.audit", Order, None, queue="audit")
checkout = cyclone.define("integrations.checkout", Order)
checkout.node(ship)

ORDERS = "CREATE TABLE IF NOT EXISTS public.orders (ref text PRIMARY KEY)"


class SyncListener:
    """A real LISTEN connection (psycopg) on the client's channel."""

    def __init__(self, dsn: str, channel: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(f"LISTEN {channel}")
        self.channel = channel
        self.payloads: list[str] = []

    def settle(self) -> Counter[str]:
        """Every payload sent before now (a marker of our own arrives after them)."""
        marker = f"marker:{time.monotonic_ns()}"
        self.conn.execute("SELECT pg_notify(%s, %s)", (self.channel, marker))
        deadline = time.monotonic() + 30
        while marker not in self.payloads:
            assert time.monotonic() < deadline, "the marker NOTIFY never arrived"
            select.select([self.conn.fileno()], [], [], 1.0)
            self.payloads.extend(n.payload for n in self.conn.notifies(timeout=0, stop_after=0))
        self.payloads.remove(marker)
        found, self.payloads = Counter(self.payloads), []
        return found


@pytest.fixture
def sync_listener(cyclone_env: CycloneEnv) -> Iterator[SyncListener]:
    listener = SyncListener(cyclone_env.dsn, cyclone_env.client._channel)
    try:
        yield listener
    finally:
        listener.conn.close()


def sync_waiting_on_a_lock(dsn: str) -> None:
    """Until some session of the database waits on a lock (observed, not slept on)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while not conn.execute(
            "SELECT count(*) > 0 FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "no session waited on a lock"
            time.sleep(0.01)


def order_refs(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT ref FROM public.orders ORDER BY ref")]


def create_orders(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ORDERS)
