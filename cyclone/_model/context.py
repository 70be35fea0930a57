"""The handler's context: who it is, its dependencies' outputs, its completion transaction.

:class:`HandlerContext` is the context a worker (or ``cyclone.testing.new_context``) gives a
handler; ``cyclone.Context`` is it with ``client`` typed as the facade's ``cyclone.Client``.
"""

from __future__ import annotations

import asyncio
import uuid
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import msgspec

from cyclone._model import codec
from cyclone._model.errors import ContextError, UnknownNodeError
from cyclone._model.streams import VALUE_LIMIT, Reporter, StreamWriter

if TYPE_CHECKING:
    import asyncpg

    from cyclone._model.ports import Tx

C = TypeVar("C")


class Snooze(Exception):
    """Raise from a handler to run it again after ``delay`` seconds without spending an attempt."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(f"snoozed for {delay} s")
        self.delay = float(delay)


class Completion(Protocol):
    """What a context's completion transaction is: ``CompletionTx`` in a worker, the
    test kit's ``TxRecorder`` in a unit test."""

    async def open(self) -> Any:
        """Begin it (once); the connection to pass as ``tx``."""
        ...

    @property
    def connection(self) -> Any:
        """The connection a handler writes on (after :meth:`open`)."""
        ...


# The scope of the plain ``def`` handler running in this thread. Set in the thread's own
# context, so that the tasks ``anyio.from_thread.run`` starts from it (which copy the
# thread's context) count as the handler's, and nothing else does.
_THREAD_SCOPE: ContextVar[HandlerScope | None] = ContextVar("cyclone_thread_scope", default=None)


class HandlerScope:
    """Where a handler's context may be used: from the handler's own task (once bound), or
    from its thread through ``anyio.from_thread``, until the handler returns (closed). The
    executor holds it; the context checks it. ``cancelled`` is set when the attempt ended
    while its handler's thread still ran."""

    __slots__ = ("cancelled", "closed", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.closed = False
        self.cancelled = False

    def bind(self) -> None:
        """The current task is the handler's."""
        self.task = asyncio.current_task()

    def enter_thread(self) -> None:
        """The current thread runs the handler (a plain ``def`` one)."""
        _THREAD_SCOPE.set(self)

    def abandon(self) -> None:
        """The attempt ended (cancelled, timed out, handed back) while its handler's thread
        runs on: the thread may see it, and the context is no longer usable."""
        self.cancelled = True
        self.closed = True

    def close(self) -> None:
        """The handler returned."""
        self.closed = True

    def check(self, what: str) -> None:
        """Raise :class:`ContextError` for ``what`` done out of the handler's scope."""
        if self.cancelled:
            raise ContextError(f"{what} after the attempt was cancelled")
        if self.closed:
            raise ContextError(f"{what} after the handler returned")
        if (
            self.task is not None
            and asyncio.current_task() is not self.task
            and _THREAD_SCOPE.get() is not self
        ):
            raise ContextError(f"{what} from a task other than the handler's own")


class HandlerAttempt(Protocol):
    """The attempt a handler runs, as its claimed task names it: its run, node (None for a
    job), kind, number, most attempts, and the queue it was claimed from."""

    @property
    def run_id(self) -> uuid.UUID: ...
    @property
    def node(self) -> str | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def queue(self) -> str: ...


class HandlerContext(Generic[C]):
    """What a handler knows about its attempt, passed as its first argument: ``client`` is
    a ``C``. ``cyclone.Context`` is the context with the facade's ``cyclone.Client``."""

    def __init__(
        self,
        client: C,
        attempt: HandlerAttempt,
        *,
        outputs: dict[str, Any] | None = None,
        output_types: dict[str, Any] | None = None,
        completion: Completion | None = None,
        scope: HandlerScope | None = None,
        streams: StreamWriter | None = None,
    ) -> None:
        self.client = client
        self.run_id = attempt.run_id
        self.node = attempt.node
        self.kind = attempt.kind
        self.attempt = attempt.attempt
        self.max_attempts = attempt.max_attempts
        self.queue = attempt.queue
        self._outputs = outputs or {}
        self._output_types = output_types or {}
        self._completion = completion
        self._scope = scope or HandlerScope()
        self._streams = streams
        self._reporter: Reporter | None = None

    def __repr__(self) -> str:
        return f"<cyclone.Context run={self.run_id} node={self.node!r} attempt={self.attempt}>"

    def _check(self, what: str) -> None:
        self._scope.check(what)

    @property
    def cancelled(self) -> bool:
        """True once this attempt ended while its handler still runs: the run was cancelled,
        the lease lost, the ``timeout`` passed or the worker shut down.

        A plain ``def`` handler runs in a thread, which cannot be interrupted: a long one
        checks this (or calls :meth:`raise_if_cancelled`) and stops early; what it returns
        after that is discarded. An ``async def`` handler is cancelled instead.
        """
        return self._scope.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise ``asyncio.CancelledError`` if :attr:`cancelled`: a plain ``def`` handler
        calls it between pieces of work to stop once its attempt has ended."""
        if self._scope.cancelled:
            raise asyncio.CancelledError(
                f"the attempt {self.attempt} of {self.kind!r} (run {self.run_id}) was cancelled"
            )

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

    async def output(self, node: Any) -> Any:
        """The decoded output of dependency ``node``: a node handle or its name.
        (``cyclone.Context`` types it: a ``Node[Out]`` gives an ``Out``.)"""
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

    async def report(self, value: Any) -> None:
        """Report this node's progress: a JSON value (a number, a fraction, a small dict).

        The latest report wins (``run.progress()`` reads it). Writes are throttled to a few
        a second per attempt; a report made sooner is written when the interval passes or
        when the handler returns, whichever comes first. Each write is a short statement of
        its own, outside the completion transaction: it shows while the handler runs and
        stays when the attempt fails.
        """
        self._check("report()")
        encoded = codec.encode(value, Any, what="a progress report", limit=VALUE_LIMIT)
        if self._reporter is None:
            streams, attempt, node = self._writer(), self.attempt, self.node or self.kind
            run_id = self.run_id
            self._reporter = Reporter(
                lambda text: streams.report(run_id, node, attempt, text), streams.report_interval
            )
        await self._reporter.report(encoded)

    async def stream(self, item: Any) -> int:
        """Append ``item`` (a JSON value) to the run's stream; its offset.

        Once this returns the item is durable, whatever happens to the attempt: a retry
        streams on after it, its items marked with its attempt. Written in a statement of
        its own, outside the completion transaction. :class:`InvalidStateError` when the
        run has ended (its stream is closed).
        """
        self._check("stream()")
        encoded = codec.encode(item, Any, what="a stream item", limit=VALUE_LIMIT)
        return await self._writer().append(
            self.run_id, self.node or self.kind, self.attempt, encoded
        )

    def _writer(self) -> StreamWriter:
        if self._streams is None:
            raise ContextError("this context has no stream to write to")
        return self._streams

    # Internal, for the worker once the handler returned (no docstring, so the reference
    # leaves it out): the last progress report, if one waits, is written now.
    async def settle_reports(self) -> None:
        if self._reporter is not None:
            await self._reporter.settle()
