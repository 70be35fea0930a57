"""The one insert path behind every enqueue and submit variant.

``tx is None``: Cyclone takes a pooled connection, writes, commits, and publishes the wakeup.
``tx`` given: Cyclone writes in the caller's open transaction and never begins, commits or
rolls it back; a tracked ``tx`` records the wakeup for the caller to publish after commit.
Everything is checked before the first statement, so bad input writes nothing.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import asyncpg
from asyncpg.pgproto.pgproto import UUID as PgUUID

from cyclone import _codec
from cyclone import _queries as db
from cyclone._codec import DEFAULT_PAYLOAD_LIMIT
from cyclone._errors import DuplicateError, InvalidInputError, NotInTransactionError
from cyclone._notifier import queue_payload
from cyclone._options import EnqueueOptions, Options, parse
from cyclone._recorder import RecordedEnqueue, TxRecorder
from cyclone._run import ResultRun
from cyclone._wakeups import TrackedConnection, Tx, unwrap

if TYPE_CHECKING:
    from cyclone._client import Client
    from cyclone._kinds import Kind

logger = logging.getLogger("cyclone")

# The option names a call takes at run time are the keys its TypedDict gives a type checker.
ENQUEUE_OPTIONS = EnqueueOptions.__optional_keys__
# A duplicate's holder can end between our insert and our look-up; then we insert again.
_UNIQUE_TRIES = 3


def uuid7_many(n: int) -> list[uuid.UUID]:
    """``n`` time-ordered UUIDs (version 7), ascending in the order asked for.

    Runs list newest-first by id, and inserts stay at the right edge of the primary key. One
    clock read and one random draw per batch (RFC 9562, "monotonic random"): the first id takes
    73 random bits under the millisecond, the others count up from it, so two batches of the
    same millisecond would have to draw overlapping ranges out of 2**73 to collide. They are
    asyncpg's own UUID type (a :class:`uuid.UUID`), which it builds and sends in C.
    """
    millis = (time.time_ns() // 1_000_000) & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    # 12 random bits in rand_a; 61 in rand_b, whose top bit stays clear so counting never
    # reaches the variant bits.
    first = millis << 80 | 0x7 << 76 | (rand >> 68) << 64 | 0b10 << 62 | (rand & ((1 << 61) - 1))
    return [PgUUID((first + i).to_bytes(16, "big")) for i in range(n)]


def uuid7() -> uuid.UUID:
    """One time-ordered UUID; see :func:`uuid7_many`."""
    return uuid7_many(1)[0]


def check_options(options: Mapping[str, Any], allowed: frozenset[str], *, call: str) -> Options:
    """Reject unknown option names, then parse the rest."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        known = ", ".join(sorted(allowed))
        raise InvalidInputError(
            f"unknown option(s) {', '.join(unknown)} for {call}; known: {known}"
        )
    return parse(**options)


def require_transaction(tx: Tx) -> tuple[db.Conn, TrackedConnection | None]:
    """The raw connection of ``tx`` and its tracker; it must have an open transaction."""
    conn, tracker = unwrap(tx)
    if not conn.is_in_transaction():
        raise NotInTransactionError(
            "a *_tx call needs a connection inside a transaction (async with conn.transaction())"
        )
    return conn, tracker


def payload_limit(client: Client | None, tx: object) -> int:
    """The client's input limit; a recorder in a unit test may come without a client."""
    if client is None:
        if not isinstance(tx, TxRecorder):
            raise InvalidInputError("a client is needed to enqueue or submit")
        return DEFAULT_PAYLOAD_LIMIT
    return client.payload_limit


async def enqueue(
    client: Client,
    tx: Tx | TxRecorder | None,
    kind: Kind[Any, Any],
    inputs: Sequence[Any],
    options: Mapping[str, Any],
) -> list[ResultRun[Any]]:
    """Insert standalone jobs of ``kind``; handles in the order of ``inputs``."""
    opts = check_options(options, ENQUEUE_OPTIONS, call="enqueue")
    if opts.unique is not None and len(inputs) != 1:
        raise InvalidInputError("unique= applies to a single enqueue, not to enqueue_many")
    if not inputs:
        return []
    encoded = _codec.encode_many(
        inputs, kind.input_type, what=f"input of {kind.name!r}", limit=payload_limit(client, tx)
    )
    ids = uuid7_many(len(encoded))
    queue = opts.queue or kind.queue
    if isinstance(tx, TxRecorder):
        tx.enqueued.extend(
            RecordedEnqueue(kind.name, value, opts, i) for value, i in zip(inputs, ids, strict=True)
        )
        return [ResultRun(client, i, kind.output_type) for i in ids]
    span = {"cyclone.kind": kind.name, "cyclone.queue": queue, "cyclone.count": len(ids)}
    with client.observers.enqueue_span(f"enqueue {kind.name}", span):
        trace = trace_text(client)
        if tx is None:
            # The connection's reset on release is not waited for (see _insert_jobs for the
            # wakeup of an insert that commits on its own).
            async with client._borrow() as pooled:
                if opts.sequence is None:  # each statement commits on its own
                    await _insert_jobs(client, pooled, kind, ids, encoded, opts, queue, trace)
                else:  # the sequence's lock lasts until the insert commits
                    async with pooled.transaction():
                        await _insert_jobs(client, pooled, kind, ids, encoded, opts, queue, trace)
            if opts.sequence is not None and opts.claimable_now():
                client._publish([queue_payload(queue)])
        else:
            conn, tracker = require_transaction(tx)
            await _insert_jobs(client, conn, kind, ids, encoded, opts, queue, trace)
            if tracker is not None and opts.claimable_now():
                tracker.record(queue)
    client.observers.enqueued(kind.name, queue, len(ids))
    return [ResultRun(client, i, kind.output_type) for i in ids]


def trace_text(client: Client) -> str | None:
    """The current trace context as JSON text, to store with runs written now."""
    carrier = client.observers.trace_context()
    return None if carrier is None else _codec.encode_plain(carrier)


async def _insert_jobs(
    client: Client,
    conn: db.Conn,
    kind: Kind[Any, Any],
    ids: list[uuid.UUID],
    encoded: list[str],
    opts: Options,
    queue: str,
    trace: str | None,
) -> None:
    q = client.queries
    if opts.sequence is not None:
        await db.sequence_lock(conn, q, kind.name, opts.sequence)
    # An insert that commits on its own (Cyclone's autocommit statement, never a transaction,
    # the caller's or ours) wakes workers itself: its NOTIFY is delivered at its commit. One
    # at a time: the server serializes notifying commits through their WAL flush, so while
    # one is in flight the others publish after their commit, merged (client._publish).
    wake = not conn.is_in_transaction() and opts.claimable_now()
    inline = wake and client.notify_coalesce <= 0 and not client._notifying
    notify = (client.channel, queue_payload(queue)) if inline else None
    max_attempts = kind.max_attempts if opts.max_attempts is None else opts.max_attempts
    carrying = int(inline)
    client._notifying += carrying
    try:
        for _ in range(_UNIQUE_TRIES):
            try:
                inserted = await db.job_insert_many(
                    conn,
                    q,
                    ids=ids,
                    inputs=encoded,
                    kind=kind.name,
                    queue=queue,
                    priority=kind.priority if opts.priority is None else opts.priority,
                    process_at=opts.process_at,
                    max_attempts=max_attempts,
                    sequence=opts.sequence,
                    unique=opts.unique,
                    deadline=opts.run_deadline,
                    trace=trace,
                    notify=notify,
                    group=opts.group,
                )
            except asyncpg.ProgramLimitExceededError as exc:
                if notify is None or "NOTIFY queue" not in str(exc):
                    raise
                # The server's notification queue is full (a listener stuck in a long
                # transaction): the commit failed, taking the insert with it. Insert again
                # without the NOTIFY; its wakeup is then published after the commit.
                logger.warning(
                    "enqueueing %s on queue %s without its NOTIFY (%s); workers "
                    "find it at their next poll",
                    kind.name,
                    queue,
                    exc,
                )
                notify, inline = None, False
                continue
            if inserted or opts.unique is None:
                break
            holder = await db.job_find_unique(conn, q, kind.name, opts.unique)
            if holder is not None:
                raise DuplicateError(kind.name, opts.unique, holder)
        else:
            raise RuntimeError(f"unique key {opts.unique!r} of {kind.name!r} kept changing hands")
    finally:
        client._notifying -= carrying
    if wake and not inline:
        client._publish([queue_payload(queue)])
