"""The runs service: reads of one run and the actions on it, for ``Run`` handles and the client.

A read runs on its own pooled connection; an action (cancel, retry) in Cyclone's own
transaction, announcing what it changed after the commit. The pure functions at the end turn
rows into read models; the synchronous client shares them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from cyclone._model import codec
from cyclone._model.errors import (
    InvalidInputError,
    InvalidStateError,
    NoOutputError,
    RunCancelledError,
    RunExpiredError,
    RunFailedError,
    RunNotFoundError,
)
from cyclone._model.events import Signal
from cyclone._model.handles import (
    NodeInfo,
    NodePayloads,
    RunInfo,
    RunPage,
    RunPayloads,
    RunQuery,
    RunState,
)
from cyclone._model.keyring import Keyring, reveal, shown
from cyclone._model.keys import validate_key, validate_name
from cyclone._model.options import validate_int
from cyclone._services import transitions
from cyclone._services.database import Database
from cyclone._services.notifier import Notifier
from cyclone._services.publisher import Publisher
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

_GONE = (
    "it was deleted as it ended: its kind keeps nothing once completed "
    "(Retention(completed=KEEP_NOTHING)), so it has no state or result to read; or a purge "
    "took it meanwhile"
)
WAIT_POLL_MAX = 1.0  # run.wait() polls at least this often, whatever notifications do
DIAGNOSE_TIMEOUT = 2.0  # seconds a timed-out wait spends finding what holds the run up
_T = TypeVar("_T")


class Runs:
    """Run reads and actions on ``database``; ``notifier`` (None: ``notify=False``) wakes
    waits when a run ends."""

    def __init__(
        self,
        database: Database,
        publisher: Publisher,
        notifier: Notifier | None,
        cipher: Keyring | None = None,
    ) -> None:
        self.database = database
        self.publisher = publisher
        self.notifier = notifier
        self.cipher = cipher

    async def status(self, run_id: uuid.UUID) -> RunState:
        """The run's state; :class:`RunNotFoundError` if it is not visible."""
        async with self.database.acquire() as conn:
            state = await db.run_status(conn, self.database.queries, run_id)
        if state is None:
            raise RunNotFoundError(run_id)
        return RunState(state)

    async def wait(self, run_id: uuid.UUID, timeout: float | None) -> RunState:
        """Wait until the run ends; its state."""
        state, _ = await self.until_ended(run_id, timeout, self._read_state)
        return state

    async def result(self, run_id: uuid.UUID, output_type: Any, timeout: float | None) -> Any:
        """Wait until the run ends; its typed output, or the error it ended with."""
        # The read that sees the run ended is the one that returns its output.
        _, row = await self.until_ended(run_id, timeout, self._read_result)
        return result_of(run_id, row, output_type, self.cipher)

    async def _read_state(self, run_id: uuid.UUID) -> tuple[RunState, None]:
        return await self.status(run_id), None

    async def _read_result(self, run_id: uuid.UUID) -> tuple[RunState, db.Record]:
        async with self.database.acquire() as conn:
            row = await db.run_result(conn, self.database.queries, run_id)
        if row is None:
            raise RunNotFoundError(run_id)
        return RunState(row["state"]), row

    async def until_ended(
        self,
        run_id: uuid.UUID,
        timeout: float | None,
        read: Callable[[uuid.UUID], Awaitable[tuple[RunState, _T]]],
    ) -> tuple[RunState, _T]:
        """``read`` the run until its state is terminal; woken by the run's end notification,
        polled with a growing delay (at most ``WAIT_POLL_MAX``) as the floor.

        When ``timeout`` passes, the builtin :class:`TimeoutError` says which run, and what
        holds it up if no live worker serves some of its claimable work.
        """
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._poll_until_ended(run_id, read)
        except TimeoutError:
            if not deadline.expired():
                raise  # from the read itself, not our deadline
            raise TimeoutError(await self._timeout_message(run_id, timeout)) from None

    async def _timeout_message(self, run_id: uuid.UUID, timeout: float | None) -> str:
        try:
            async with asyncio.timeout(DIAGNOSE_TIMEOUT), self.database.acquire() as conn:
                rows = await db.run_unserved(conn, self.database.queries, run_id)
        except (*db.DATABASE_ERRORS, InvalidStateError, TimeoutError) as exc:
            return timeout_message(run_id, timeout, exc)
        return timeout_message(run_id, timeout, rows)

    async def _poll_until_ended(
        self, run_id: uuid.UUID, read: Callable[[uuid.UUID], Awaitable[tuple[RunState, _T]]]
    ) -> tuple[RunState, _T]:
        notifier, event = self.notifier, None
        if notifier is not None:
            notifier.acquire()
            event = notifier.watch_run(run_id)
        try:
            delay = 0.05
            seen = False
            while True:
                try:
                    state, found = await read(run_id)
                except RunNotFoundError:
                    if not seen:
                        raise
                    raise RunNotFoundError(run_id, _GONE) from None
                seen = True
                if state.terminal:
                    return state, found
                if event is None:
                    await asyncio.sleep(delay)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), delay)
                    event.clear()
                delay = min(delay * 2, WAIT_POLL_MAX)
        finally:
            if notifier is not None and event is not None:
                notifier.unwatch_run(run_id, event)
                await asyncio.shield(notifier.release())

    async def info(self, run_id: uuid.UUID) -> RunInfo:
        """The run with its nodes, edges, input and output."""
        q = self.database.queries
        async with self.database.acquire() as conn:
            row = await db.run_get(conn, q, run_id)
            if row is None:
                raise RunNotFoundError(run_id)
            nodes = await db.run_nodes(conn, q, run_id)
            edges = await db.run_edges(conn, q, run_id)
            payload = await db.run_payload(conn, q, run_id)
            links = [
                (r["what"], (r["run_id"], r["node"]))
                for r in await db.run_fork_links(conn, q, run_id)
            ]
        info = dataclasses.replace(
            run_info(row, payload, self.cipher),
            parent_run=row["parent_run"],
            parent_node=row["parent_node"],
            forked_from=next((link for what, link in links if what == "from"), None),
        )
        info.forks.extend(link for what, link in links if what == "fork")
        info.edges.extend((e["parent"], e["child"]) for e in edges)
        info.branches.extend(
            (e["parent"], e["child"], codec.decode(e["cond"], Any))
            for e in edges
            if e["cond"] is not None
        )
        info.nodes.extend(
            NodeInfo(
                name=n["node"],
                kind=n["kind"],
                state=n["state"],
                attempts=n["attempts"],
                errors=codec.decode(shown(self.cipher, n["errors"]), list[dict[str, Any]]),
                map_of=n["map_of"],
                item=n["item"],
                child_run=n["child_run"],
                wake_at=n["wake_at"],
            )
            for n in nodes
        )
        return info

    async def payloads(self, run_id: uuid.UUID) -> RunPayloads:
        """The run's input and output, and each node's output and signal payload."""
        async with self.database.acquire() as conn:
            row = await db.run_payload(conn, self.database.queries, run_id)
            if row is None:
                raise RunNotFoundError(run_id)
            nodes = await db.node_payloads(conn, self.database.queries, run_id)
        cipher = self.cipher
        return RunPayloads(
            input=_decoded(row["input"], cipher),
            output=_decoded(row["output"], cipher),
            nodes={
                n["node"]: NodePayloads(
                    queue=n["queue"],
                    output=_decoded(n["output"], cipher),
                    signal=_decoded(n["signal"], cipher),
                    signalled=n["signal"] is not None,
                )
                for n in nodes
            },
        )

    async def cancel(self, run_id: uuid.UUID) -> bool:
        """Cancel the run; whether this call cancelled it."""
        async with self.database.transact() as conn:
            cancelled, effects = await transitions.cancel(conn, self.database.queries, run_id)
        self.publisher.publish(effects.payloads())
        return cancelled

    async def retry(self, run_id: uuid.UUID, node: str | None) -> None:
        """Reset ``node`` (None: every failed node) of a failed run."""
        async with self.database.transact() as conn:
            effects = await transitions.retry(conn, self.database.queries, run_id, node)
        self.publisher.publish(effects.payloads())

    async def signal(self, run_id: uuid.UUID, sent: Signal) -> None:
        """Deliver ``sent`` to its wait node (``transitions.signal``)."""
        async with self.database.transact() as conn:
            effects = await transitions.signal(conn, self.database.queries, run_id, sent)
        self.publisher.publish(effects.payloads())

    async def page(self, query: RunQuery) -> RunPage:
        """Runs matching ``query``, newest first: one page (``Client.list_runs``)."""
        async with self.database.acquire() as conn:
            return await page_on(conn, self.database.queries, query, self.cipher)

    async def purge(
        self,
        ages: list[tuple[RunState, dt.timedelta]],
        batch: int,
        *,
        batches: int | None,
        on_batch: Callable[[int], None] | None = None,
        names: Sequence[str] | None = None,
        others: bool = False,
    ) -> int:
        """Purge in batches of ``batch``, each its own transaction; stop after ``batches``
        per state. The cutoff is fixed at the start, so a busy system cannot keep it going.
        Runs of ``names`` only (None: any); with ``others``, only of names without a
        retention of their own."""
        now = dt.datetime.now(dt.UTC)
        total = 0
        for state, age in ages:
            done = 0
            while batches is None or done < batches:
                async with self.database.acquire() as conn:
                    count = await db.run_purge(
                        conn,
                        self.database.queries,
                        now - age,
                        [state.value],
                        batch,
                        names=names,
                        others=others,
                    )
                total += count
                done += 1
                if on_batch is not None:
                    on_batch(count)
                if count < batch:
                    break
        return total


def _decoded(raw: str | None, cipher: Keyring | None) -> Any:
    return None if raw is None else codec.decode(shown(cipher, raw), Any)


def result_of(run_id: uuid.UUID, row: db.Record, output_type: Any, cipher: Keyring | None) -> Any:
    """The typed result of an ended run's ``run_result`` row, or the error it ended with;
    :class:`KeyringError` for a result sealed with a key ``cipher`` lacks."""
    if row["state"] == "failed":
        raise RunFailedError(run_id, _decoded(row["error"], cipher))
    if row["state"] == "cancelled":
        raise RunCancelledError(run_id)
    if row["state"] == "expired":
        raise RunExpiredError(run_id)
    if not row["job"] and row["result_node"] is None:
        raise NoOutputError(run_id)
    if not row["job"] and row["output"] is None:  # a branch before it was not taken
        raise NoOutputError(run_id, f"completed with its result node {row['result_node']} skipped")
    return codec.decode(reveal(cipher, row["output"]), output_type)


def search_args(query: RunQuery) -> db.RunFilters:
    """The filters of ``query`` as run_search and run_count take them, checked."""
    states = query.state
    if isinstance(states, RunState | str):
        states = [states]
    if query.scan is not None:
        validate_int(query.scan, what="scan", low=1)
    cursor = None
    if query.cursor is not None:
        try:
            cursor = uuid.UUID(query.cursor)
        except ValueError:
            raise InvalidInputError(f"not a cursor from list_runs: {query.cursor!r}") from None
    return db.RunFilters(
        name=None if query.name is None else validate_name(query.name, what="name"),
        key=None if query.key is None else validate_key(query.key),
        created_after=query.created_after,
        created_before=query.created_before,
        cursor=cursor,
        states=None if states is None else [RunState(s).value for s in states],
        queue=query.queue,
    )


def run_info(
    row: db.Record, payload: db.Record | None = None, cipher: Keyring | None = None
) -> RunInfo:
    """A run's row (and its input and output, if read) as a :class:`RunInfo`; sealed values
    opened with ``cipher``, or shown as ``<encrypted with key ID>`` without their key."""
    input = output = None
    if payload is not None:
        input = _decoded(payload["input"], cipher)
        output = _decoded(payload["output"], cipher)
    return RunInfo(
        id=row["id"],
        name=row["name"],
        key=row["key"],
        state=RunState(row["state"]),
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        error=codec.decode(shown(cipher, row["error"]), dict[str, Any]) if row["error"] else None,
        job=row["job"],
        input=input,
        output=output,
    )


async def page_on(
    conn: db.Conn, q: Queries, query: RunQuery, cipher: Keyring | None = None
) -> RunPage:
    """One page of runs matching ``query``, newest first, read on ``conn`` (either driver)."""
    limit = validate_int(query.limit, what="limit", low=1)
    filters = search_args(query)
    rows = await db.run_search(conn, q, filters, limit=limit + 1, scan=query.scan)
    runs = [run_info(r, cipher=cipher) for r in rows[:limit]]
    if len(rows) > limit:
        next_cursor: str | None = str(runs[-1].id)
    elif query.scan is not None:
        # A short page from a bounded walk: go on from where the walk ended, if the history
        # goes on.
        end = await db.run_walk_end(conn, q, filters.cursor, query.scan)
        next_cursor = None if end is None else str(end)
    else:
        next_cursor = None
    return RunPage(runs=runs, next_cursor=next_cursor)


def timeout_message(
    run_id: uuid.UUID, timeout: float | None, unserved: Sequence[db.Record] | BaseException
) -> str:
    """What a wait that timed out says: which run, and what holds it up, from its
    ``run_unserved`` rows (or the error that kept them from being read)."""
    message = f"run {run_id} did not end within {timeout:g} s"
    if isinstance(unserved, BaseException):
        return f"{message} (what holds it up is unknown: {unserved!r})"
    blocked = [
        (f"node {r['node']!r} ({r['kind']})" if r["node"] else f"job {r['kind']!r}")
        + f" on queue {r['queue']!r}"
        for r in unserved
    ]
    if len(blocked) == 1:
        message += f": {blocked[0]} is available and no live worker serves it"
    elif blocked:
        message += f": {', '.join(blocked)} are available and no live worker serves them"
    return message
