"""The synchronous client in the caller's transaction, in each style (psycopg, SQLAlchemy
Session on psycopg, Django atomic()): what commits together, what rolls back together, and
when workers are woken."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg_pool
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import cyclone
import cyclone.sync
from cyclone.testing.plugin import CycloneEnv
from tests.frameworks.conftest import (
    Order,
    SyncListener,
    audit,
    checkout,
    create_orders,
    order_refs,
    ship,
    sync_waiting_on_a_lock,
)
from tests.frameworks.sync_styles import STYLES, Style


@pytest.fixture(params=STYLES, ids=[s.name for s in STYLES])
def style(request: pytest.FixtureRequest, cyclone_env: CycloneEnv) -> Iterator[Style]:
    create_orders(cyclone_env.dsn)
    made: Style = request.param(cyclone_env.dsn)
    try:
        yield made
    finally:
        made.close()


def test_commit_writes_the_order_and_the_run_and_wakes_after(
    style: Style, sync_listener: SyncListener
) -> None:
    client = style.client
    with style.transaction() as tx:
        style.insert_order(tx, "o-1")
        run = client.enqueue_tx(tx, ship, Order("o-1"))
        with pytest.raises(cyclone.RunNotFoundError):
            run.status()  # not visible to anyone else before the commit
        assert sync_listener.settle() == {}
    assert order_refs(style.dsn) == ["o-1"]
    assert run.status() is cyclone.RunState.PENDING
    assert client.get_run(run.id).id == run.id
    assert sync_listener.settle() == {"q:ship": 1}


def test_rollback_leaves_neither_order_nor_run(style: Style, sync_listener: SyncListener) -> None:
    client = style.client
    with pytest.raises(ZeroDivisionError), style.transaction() as tx:
        style.insert_order(tx, "o-2")
        run = client.enqueue_tx(tx, ship, Order("o-2"))
        _, _ = client.submit_once_tx(tx, checkout, "k-2", Order("o-2"))
        1 / 0  # noqa: B018
    with pytest.raises(cyclone.RunNotFoundError):
        client.get_run(run.id)
    assert client.list_runs().runs == []
    assert order_refs(style.dsn) == []
    assert sync_listener.settle() == {}


def test_a_savepoint_that_rolls_back_drops_its_wakeups(
    style: Style, sync_listener: SyncListener
) -> None:
    client = style.client
    with style.transaction() as tx:
        kept = client.enqueue_tx(tx, ship, Order("kept"))
        with pytest.raises(ZeroDivisionError), style.savepoint(tx):
            dropped = client.enqueue_tx(tx, audit, Order("dropped"))
            1 / 0  # noqa: B018
        with style.savepoint(tx):
            released = client.enqueue_tx(tx, ship, Order("released"))
    assert sync_listener.settle() == {"q:ship": 1}
    assert kept.status() is released.status() is cyclone.RunState.PENDING
    with pytest.raises(cyclone.RunNotFoundError):
        dropped.status()


def test_submit_once_tx_same_key_twice_and_a_second_transaction_waits(style: Style) -> None:
    client = style.client
    other: dict[str, Any] = {}

    def second() -> None:
        # Its own connection (and for Django, its own thread's connection).
        try:
            with style.transaction() as tx2:
                other["result"] = client.submit_once_tx(tx2, checkout, "k-3", Order("o-3"))
        finally:
            style.thread_done()

    with style.transaction() as tx:
        run, created = client.submit_once_tx(tx, checkout, "k-3", Order("o-3"))
        again, again_created = client.submit_once_tx(tx, checkout, "k-3", Order("o-3"))
        assert (created, again_created, again.id) == (True, False, run.id)
        thread = threading.Thread(target=second)
        thread.start()
        sync_waiting_on_a_lock(style.dsn)  # blocked on the key until we commit
        assert "result" not in other
    thread.join(timeout=60)
    assert not thread.is_alive()
    second_run, second_created = other["result"]
    assert (second_run.id, second_created) == (run.id, False)


def test_outside_a_transaction_is_refused(style: Style) -> None:
    outside = style.outside()
    with pytest.raises(cyclone.NotInTransactionError, match=r"transaction|atomic"):
        style.client.enqueue_tx(outside, ship, Order("o-4"))
    with pytest.raises(cyclone.NotInTransactionError):
        style.client.submit_once_tx(outside, checkout, "k-4", Order("o-4"))
    assert style.client.list_runs().runs == []


def test_own_statement_enqueue_submit_read_and_signal(
    cyclone_env: CycloneEnv, sync_listener: SyncListener
) -> None:
    waits = cyclone.define("integrations.waits", Order)
    waits.wait("approval")
    with psycopg_pool.ConnectionPool(cyclone_env.dsn, min_size=1, max_size=2) as pool:
        client = cyclone.sync.Client(pool)
        runs = client.enqueue_many(ship, [Order("a"), Order("b")])
        one = client.enqueue(audit, Order("c"), unique="only-one")
        with pytest.raises(cyclone.DuplicateError):
            client.enqueue(audit, Order("c"), unique="only-one")
        run = client.submit(waits, Order("w"))
        grouped = client.enqueue(ship, Order("g"), group="tenant-1")
        grouped_run = client.submit(checkout, Order("g"), group="tenant-2")
        keyed, created = client.submit_once(checkout, "k-5", Order("k"))
        with pytest.raises(cyclone.SubmitConflictError):
            client.submit_once(checkout, "k-5", Order("other"))
        page = client.list_runs(cyclone.RunQuery(limit=10))
        made = {*(r.id for r in runs), one.id, run.id, keyed.id, grouped.id, grouped_run.id}
        assert {r.id for r in page.runs} == made
        assert created and run.info().name == "integrations.waits"
        client.signal(run.id, "approval", {"ok": True})
        assert run.wait(timeout=60) is cyclone.RunState.COMPLETED
        with pytest.raises(TimeoutError, match="did not end within") as timed_out:
            one.wait(timeout=0.1)
        # As the asyncio client says it: what holds the run up.
        assert str(timed_out.value).endswith(
            f"job {audit.name!r} on queue {audit.queue!r} is available and no live worker serves it"
        )
    woken = sync_listener.settle()
    assert {p: n for p, n in woken.items() if p.startswith("q:")} == {"q:ship": 4, "q:audit": 1}
    groups = task_groups(
        cyclone_env.dsn, "SELECT run_id, group_key FROM public.cyclone_tasks WHERE group_key <> ''"
    )
    assert groups == {grouped.id: "tenant-1", grouped_run.id: "tenant-2"}
    assert woken[f"r:{run.id}"] == 1  # the signal ended the run


def test_a_sqlalchemy_session_on_another_driver_is_refused(cyclone_env: CycloneEnv) -> None:
    engine = sa.create_engine("sqlite://")
    refused = pytest.raises(cyclone.InvalidInputError, match=r"sqlite\+pysqlite.*psycopg")
    with Session(engine) as session, session.begin(), psycopg_client(cyclone_env) as c, refused:
        c.enqueue_tx(session, ship, Order("o-6"))
    engine.dispose()


def test_a_django_database_that_is_not_postgresql_is_refused(cyclone_env: CycloneEnv) -> None:
    from django.db import connections, transaction

    from tests.frameworks.sync_styles import configure_django

    configure_django(cyclone_env.dsn)
    refused = pytest.raises(cyclone.InvalidInputError, match="sqlite; Cyclone needs PostgreSQL")
    with psycopg_client(cyclone_env) as client, transaction.atomic(using="lite"), refused:
        client.enqueue_tx(connections["lite"], ship, Order("o-7"))
    connections.close_all()


@contextlib.contextmanager
def psycopg_client(env: CycloneEnv) -> Iterator[cyclone.sync.Client]:
    with psycopg_pool.ConnectionPool(env.dsn, min_size=1, max_size=2) as pool:
        yield cyclone.sync.Client(pool)


def task_groups(dsn: str, query: str) -> dict[Any, Any]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(query).fetchall())  # type: ignore[arg-type]
