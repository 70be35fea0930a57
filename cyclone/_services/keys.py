"""``client.keys``: what each key of a :class:`~cyclone.Keyring` seals, and rotation.

Rotation re-seals, under the keyring's current key, every stored value sealed with another
one, so that the old keys can then be dropped from the keyring. It goes table by table in
batches, each picked and rewritten in a short transaction of its own (``sql/keys.sql`` says
why that is safe while workers run). Values are re-sealed where they sit: the JSON around
them (an attempt's error record, a map's list) is kept as it is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone._model.errors import KeyringError
from cyclone._model.keyring import CONFIGURE, Keyring
from cyclone._model.options import validate_int
from cyclone._services.database import Database
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

_START = "(0,0)"  # the ctid before every row


@dataclass(frozen=True, slots=True)
class _Table:
    """A table's pick and write statements, its key columns and its payload columns."""

    pick: Callable[[db.Conn, Queries, str, str, int], Awaitable[list[db.Record]]]
    write: Callable[[db.Conn, Queries, Any, Sequence[Sequence[str | None]]], Awaitable[None]]
    keys: tuple[str, ...]
    payloads: tuple[str, ...]


_TABLES = (
    _Table(
        db.run_sealed_pick, db.run_sealed_write, ("id",), ("input", "output", "error", "errors")
    ),
    _Table(
        db.step_sealed_pick,
        db.step_sealed_write,
        ("run_id", "node"),
        ("input", "output", "signal", "errors"),
    ),
    _Table(db.task_sealed_pick, db.task_sealed_write, ("run_id", "id"), ("input", "errors")),
    _Table(db.schedule_sealed_pick, db.schedule_sealed_write, ("name",), ("input",)),
)


class Keys:
    """The keys of the client's sealed payloads (``client.keys``): :meth:`count` shows
    which key ids seal how many stored values, :meth:`rotate` re-seals them all under the
    keyring's current key."""

    def __init__(self, database: Database, keyring: Keyring | None) -> None:
        self._database = database
        self._keyring = keyring

    async def count(self) -> dict[str, int]:
        """How many stored values each key id seals (a scan of every payload column): what
        a rotation has left to do, and whether an old key is still needed."""
        async with self._database.acquire() as conn:
            rows = await db.sealed_count(conn, self._database.queries)
        return {r["key_id"]: r["n"] for r in rows}

    async def rotate(self, *, batch: int = 500) -> int:
        """Re-seal every stored value sealed with a key other than the keyring's current
        one; the number of rows rewritten. Safe while workers run; a row a worker holds
        locked at that moment is left for the next call (see :meth:`count`)."""
        keyring = self._keyring
        if keyring is None:
            raise KeyringError("rotating keys needs a keyring: " + CONFIGURE)
        batch = validate_int(batch, what="batch", low=1)
        total = 0
        for table in _TABLES:
            after = _START
            while True:
                done, after = await self._batch(keyring, table, after, batch)
                total += done
                if done < batch:
                    break
        return total

    async def _batch(
        self, keyring: Keyring, table: _Table, after: str, batch: int
    ) -> tuple[int, str]:
        """Pick and rewrite one batch in one transaction; how many rows, and the cursor."""
        q = self._database.queries
        async with self._database.transact() as conn:
            rows = await table.pick(conn, q, keyring.current, after, batch)
            if not rows:
                return 0, after
            keys = tuple([r[k] for r in rows] for k in table.keys)
            columns = [
                [None if r[c] is None else keyring.reseal(r[c]) for r in rows]
                for c in table.payloads
            ]
            await table.write(conn, q, keys[0] if len(keys) == 1 else keys, columns)
        return len(rows), rows[-1]["cursor"]
