"""Every error Cyclone raises on purpose.

::

    CycloneError
    ├── RunNotFoundError          the run is not visible (uncommitted, rolled back, purged)
    ├── SubmitConflictError       submit_once: the key's run has a different input
    ├── DuplicateError            enqueue(unique=...): an active run holds the key
    ├── NoOutputError             result() on a run without a result node
    ├── RunFailedError            result() on a failed run
    ├── RunCancelledError         result() on a cancelled run
    ├── UnknownKindError          a kind, node or workflow this process does not know
    ├── NotInTransactionError     a *_tx call on a connection with no open transaction
    ├── InvalidStateError         an operation the run's state does not allow
    ├── ContextError              a handler context used outside its handler
    ├── InvalidKeyError           (also ValueError) a key breaking the key rules
    ├── InvalidInputError         (also TypeError) a payload or option that cannot be used
    │   ├── InvalidNameError      (also ValueError) a schema, queue, kind or node name
    │   ├── InvalidScheduleError  a schedule's cron, time zone, interval, policy or name
    │   └── InvalidLimitError     (also ValueError) a flow-control limit that cannot hold
    ├── UnknownQueueError         flow control for a queue nothing uses (a typo?)
    ├── ScheduleNotFoundError     no schedule of that name is stored
    ├── PayloadTooLargeError      (also ValueError) an input or output over the client limit
    ├── SchemaNotMigratedError    the schema lacks migrations this package ships
    ├── SchemaVersionError        the schema has migrations this package does not know
    ├── ReadOnlyServerError       migrate() on a server that takes no writes (a standby?)
    └── UnsupportedPoolerError    a pooler in transaction mode, configured in a way it breaks

Lease loss and run cancellation reach a running handler as ``asyncio.CancelledError``,
a ``BaseException``, so ``except Exception`` in user code cannot swallow them.
"""

from __future__ import annotations

import uuid


class CycloneError(Exception):
    """Base class of every error Cyclone raises on purpose."""


class RunNotFoundError(CycloneError):
    """The run does not exist or is not visible to the client's pool.

    A run inserted in a transaction that has not committed, that rolled back, or a run
    that was purged, all look the same: not found.
    """

    def __init__(self, run_id: uuid.UUID) -> None:
        super().__init__(f"run {run_id} not found")
        self.run_id = run_id


class SubmitConflictError(CycloneError):
    """``submit_once`` found the key's run, but its input differs from this call's."""

    def __init__(self, name: str, key: str, run_id: uuid.UUID) -> None:
        super().__init__(
            f"key {key!r} of workflow {name!r} belongs to run {run_id} with a different input"
        )
        self.name = name
        self.key = key
        self.run_id = run_id


class DuplicateError(CycloneError):
    """An active run of the same kind already holds the ``unique=`` key."""

    def __init__(self, kind: str, key: str, run_id: uuid.UUID) -> None:
        super().__init__(f"an active run {run_id} of {kind!r} already holds unique key {key!r}")
        self.kind = kind
        self.key = key
        self.run_id = run_id


class NoOutputError(CycloneError):
    """The run has no result node, so there is no typed result to return."""

    def __init__(self, run_id: uuid.UUID) -> None:
        super().__init__(f"run {run_id} has no result node")
        self.run_id = run_id


class RunFailedError(CycloneError):
    """The run failed, so it has no result. ``error`` holds the cause as stored."""

    def __init__(self, run_id: uuid.UUID, error: object) -> None:
        super().__init__(f"run {run_id} failed: {error}")
        self.run_id = run_id
        self.error = error


class RunCancelledError(CycloneError):
    """The run was cancelled, so it has no result."""

    def __init__(self, run_id: uuid.UUID) -> None:
        super().__init__(f"run {run_id} was cancelled")
        self.run_id = run_id


class UnknownKindError(CycloneError):
    """A step kind, workflow, or node name that this process has not declared."""


class NotInTransactionError(CycloneError):
    """A ``*_tx`` call got a connection that has no open transaction.

    Cyclone never begins or commits a transaction on the caller's connection, so it refuses
    to write on one that would autocommit each statement.
    """


class InvalidStateError(CycloneError):
    """The run or node is in a state that does not allow this operation."""


class ContextError(CycloneError):
    """A handler's context was used after the handler returned or from another task."""


class InvalidKeyError(CycloneError, ValueError):
    """A submit or unique key breaks the key rules; nothing was written."""


class InvalidInputError(CycloneError, TypeError):
    """A payload that does not encode, or an option of the wrong type; nothing was written."""


class InvalidNameError(InvalidInputError, ValueError):
    """A schema, queue, kind, workflow or node name that breaks its rules; nothing was written."""


class PayloadTooLargeError(CycloneError, ValueError):
    """An encoded input or output is larger than the client's limit."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes encoded, over the limit of {limit} bytes")
        self.size = size
        self.limit = limit


def _versions(versions: list[int]) -> str:
    return ", ".join(str(v) for v in versions)


class SchemaNotMigratedError(CycloneError):
    """The schema lacks migrations this version of cyclone-pg ships: the database is older
    than the code. ``missing`` lists them; run ``cyclone migrate`` or ``client.migrate()``."""

    def __init__(self, schema: str, missing: list[int], *, empty: bool) -> None:
        lacks = f"lacks Cyclone migrations {_versions(missing)}"
        if empty:
            lacks = "has no Cyclone tables"
        super().__init__(
            f"schema {schema!r} {lacks}: run `cyclone migrate` (or `await client.migrate()`)"
        )
        self.schema = schema
        self.missing = missing


class SchemaVersionError(CycloneError):
    """The schema has migrations this version of cyclone-pg does not know: the code is older
    than the database. ``unknown`` lists them; upgrade cyclone-pg where this runs."""

    def __init__(self, schema: str, unknown: list[int], known: int) -> None:
        super().__init__(
            f"schema {schema!r} has Cyclone migrations {_versions(unknown)}, newer than this "
            f"version of cyclone-pg knows (up to {known}): upgrade cyclone-pg on this host"
        )
        self.schema = schema
        self.unknown = unknown


class InvalidScheduleError(InvalidInputError):
    """A schedule's declaration cannot be used (bad cron, time zone, interval, policy, name);
    nothing was written."""


class ScheduleNotFoundError(CycloneError):
    """No schedule of that name is stored in the schema."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no schedule named {name!r}: `cyclone schedules ls` lists the stored schedules"
        )
        self.name = name


class ReadOnlyServerError(CycloneError):
    """``migrate()`` reached a server that takes no writes: a hot standby, or a session with
    ``default_transaction_read_only`` on. Run migrations against the primary."""

    def __init__(self, schema: str) -> None:
        super().__init__(
            f"migrating schema {schema!r}: connected to a read-only server (a standby?): run "
            "migrations against the primary; with a multi-host DSN add "
            "target_session_attrs=read-write"
        )
        self.schema = schema


class UnsupportedPoolerError(CycloneError):
    """The pool goes through a connection pooler in transaction mode (PgBouncer's
    ``pool_mode = transaction``) with a setting that cannot work through it: asyncpg's
    statement cache, or LISTEN. The message names the fix."""


class InvalidLimitError(InvalidInputError, ValueError):
    """A flow-control limit that cannot hold: zero or negative, not an int, or a rate
    without its period. Nothing was written."""


class UnknownQueueError(CycloneError):
    """Flow control was asked for a queue that has no setting and that no live worker claims
    from: most likely a typo. Nothing was written."""

    def __init__(self, queue: str) -> None:
        super().__init__(
            f"queue {queue!r} is unknown: no setting or live worker uses it; check "
            f"the name, or pass create=True to configure it before its first use"
        )
        self.queue = queue
