"""Run ids: time-ordered UUIDs (version 7), made in the process that inserts the run."""

from __future__ import annotations

import os
import time
import uuid

from asyncpg.pgproto.pgproto import UUID as PgUUID


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
