"""The handler's context: who it is, its dependencies' outputs, its completion transaction."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, overload

import asyncpg
import msgspec

from cyclone._enqueue.wakeups import TrackedConnection, Tx
from cyclone._model import codec
from cyclone._model.errors import ContextError, UnknownNodeError
from cyclone._model.wakeups import Wakeups
from cyclone._services.database import Database
from cyclone._storage import queries as db

if TYPE_CHECKING:
    from cyclone._client import Client
    from cyclone._model.workflows import Node

logger = logging.getLogger("cyclone")

Out = TypeVar("Out")


class Snooze(Exception):
    """Raise from a handler to run it again after ``delay`` seconds without spending an attempt."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(f"snoozed for {delay} s")
        self.delay = float(delay)


class Completion(Protocol):
    """What a context's completion transaction is: :class:`CompletionTx` in a worker, the
    test kit's ``TxRecorder`` in a unit test."""

    async def open(self) -> Any:
        """Begin it (once); the connection to pass as ``tx``."""
        ...

    @property
    def connection(self) -> Any:
        """The connection a handler writes on (after :meth:`open`)."""
        ...


class CompletionTx:
    """The completion transaction of one attempt: opened on first use, written by the worker.

    It belongs to the handler's task: using it from another task, or after the handler
    returned, raises :class:`ContextError`. The worker commits it together with the step's
    completion, or rolls it back with everything in it.
    """

    def __init__(self, database: Database) -> None:
        self._database = database
        self._conn: asyncpg.pool.PoolConnectionProxy | None = None
        self._tx: Any = None
        self.wakeups = Wakeups()
        self.tracked: TrackedConnection | None = None
        self.lost: BaseException | None = None
        """What :meth:`rollback` found: the connection had been lost (the writes with it)."""

    @property
    def opened(self) -> bool:
        """Whether the handler opened it."""
        return self._conn is not None

    async def open(self) -> TrackedConnection:
        """Acquire a pooled connection and begin the transaction (once)."""
        if self.tracked is None:
            conn = await self._database.acquire()
            try:
                tx = self._database.transaction(conn)  # Cyclone's own: at READ COMMITTED
                await tx.start()
            except BaseException:
                await self._database.pool.release(conn)
                raise
            self._conn, self._tx = conn, tx
            self.tracked = TrackedConnection(conn, self.wakeups)
        return self.tracked

    @property
    def connection(self) -> asyncpg.pool.PoolConnectionProxy:
        """The open connection (only after :meth:`open`)."""
        assert self._conn is not None
        return self._conn

    async def commit(self) -> None:
        """Commit and give the connection back.

        An error from the commit itself propagates: whether it committed is then unknown (the
        caller asks the record). Once it committed, nothing after can undo that: a connection
        that fails to reset on release is logged and replaced by the pool.
        """
        try:
            await self._tx.commit()
        finally:
            await self._close()

    async def rollback(self) -> None:
        """Roll back (if open) and give the connection back; never raises for a lost
        connection.

        A connection the server ended has been detached from its pool proxy by asyncpg
        already (every call on the proxy then raises ``InterfaceError``), and its transaction
        died with it: there is nothing left to roll back. The error is kept in :attr:`lost`.
        """
        if self._conn is None:
            return
        try:
            await self._tx.rollback()
        except db.DATABASE_ERRORS as exc:  # gone with its connection: nothing to undo
            self.lost = exc
        finally:
            await self._close()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        # Not waited for: the attempt's slot frees without the pool's reset round trip (a
        # failed reset is logged, and asyncpg closes that connection).
        self._database.release_soon(conn)


class HandlerScope:
    """Where a handler's context may be used: from the handler's own task (once bound),
    until the handler returns (closed). The executor holds it; the context checks it."""

    __slots__ = ("closed", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.closed = False

    def bind(self) -> None:
        """The current task is the handler's."""
        self.task = asyncio.current_task()

    def close(self) -> None:
        """The handler returned."""
        self.closed = True

    def check(self, what: str) -> None:
        """Raise :class:`ContextError` for ``what`` done out of the handler's scope."""
        if self.closed:
            raise ContextError(f"{what} after the handler returned")
        if self.task is not None and asyncio.current_task() is not self.task:
            raise ContextError(f"{what} from a task other than the handler's own")


class Context:
    """What a handler knows about its attempt, passed as its first argument.

    ``run_id``, ``node`` (None for a standalone job), ``kind``, ``attempt`` (1 for the first),
    ``max_attempts``, ``queue`` and ``client`` (the worker's client).
    """

    def __init__(
        self,
        *,
        client: Client,
        run_id: uuid.UUID,
        node: str | None,
        kind: str,
        attempt: int,
        max_attempts: int,
        queue: str,
        outputs: dict[str, Any] | None = None,
        output_types: dict[str, Any] | None = None,
        completion: Completion | None = None,
        scope: HandlerScope | None = None,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.node = node
        self.kind = kind
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.queue = queue
        self._outputs = outputs or {}
        self._output_types = output_types or {}
        self._completion = completion
        self._scope = scope or HandlerScope()

    def __repr__(self) -> str:
        return f"<cyclone.Context run={self.run_id} node={self.node!r} attempt={self.attempt}>"

    def _check(self, what: str) -> None:
        self._scope.check(what)

    async def completion_tx(self) -> asyncpg.pool.PoolConnectionProxy:
        """The completion transaction: a pooled asyncpg connection inside a transaction.

        Business writes on it commit atomically with this step's completion and roll back
        with it (handler error, snooze, timeout, cancellation, lost lease). Do not commit it.
        In a unit test (``cyclone.testing.new_context``) it is the :class:`TxRecorder`, which
        records ``execute``, ``fetch``, ``fetchrow`` and ``fetchval``.
        """
        self._check("completion_tx()")
        if self._completion is None:
            raise ContextError("this context has no completion transaction")
        await self._completion.open()
        return cast("asyncpg.pool.PoolConnectionProxy", self._completion.connection)

    # Internal, for cyclone.enqueue_completion and submit_completion (no docstring, so the
    # reference leaves it out): the completion transaction as a tracked connection, whose
    # wakeups go out once the completion commits.
    async def completion_tracked(self) -> Tx:
        self._check("a completion enqueue")
        if self._completion is None:
            raise ContextError("this context has no completion transaction")
        # A recorder provides its own insert target: it records instead of writing.
        return cast("Tx", await self._completion.open())

    @overload
    async def output(self, node: Node[Out]) -> Out: ...
    @overload
    async def output(self, node: str) -> Any: ...
    async def output(self, node: Node[Any] | str) -> Any:
        """The decoded output of dependency ``node``: a node handle (``Node[Out]`` gives an
        ``Out``) or its name (untyped)."""
        self._check("output()")
        name = node if isinstance(node, str) else getattr(node, "name", None)
        if name not in self._outputs:
            raise UnknownNodeError(
                f"{name!r} is not a completed dependency of this node", str(name)
            )
        raw = self._outputs[name]
        if isinstance(raw, msgspec.Raw):  # as claimed from the database: decode as declared
            return codec.decode(bytes(raw), self._output_types.get(name, Any))
        return raw
