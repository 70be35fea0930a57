"""Every error Cyclone raises on purpose, grouped by what a caller catches.

::

    CycloneError
    ├── ConflictError               another run holds what this call asked for
    │   ├── SubmitConflictError       submit_once: the key's run has a different input
    │   ├── DuplicateError            enqueue(unique=...): an active run holds the key
    │   └── KeyContentionError        (also RuntimeError) a key kept changing hands meanwhile
    ├── RunOutcomeError             result(): the run ended without a result to give
    │   ├── RunFailedError            the run failed
    │   ├── RunCancelledError         the run was cancelled
    │   ├── RunExpiredError           the job expired before it started
    │   └── NoOutputError             the run has no result node
    ├── NotFoundError               the call names something that does not exist (here)
    │   ├── RunNotFoundError          the run is not visible (uncommitted, rolled back, purged)
    │   ├── ScheduleNotFoundError     no schedule of that name is stored
    │   ├── UnknownQueueError         flow control for a queue nothing uses (a typo?)
    │   └── UnknownKindError          a kind, node or workflow this process does not know
    │       └── UnknownNodeError        a node that its workflow or run does not have
    ├── InvalidInputError           (also TypeError) a value the call cannot use; nothing written
    │   ├── InvalidKeyError           (also ValueError) a key breaking the key rules
    │   ├── InvalidNameError          (also ValueError) a schema, queue, kind or node name
    │   ├── InvalidScheduleError      a schedule's cron, time zone, interval, policy or name
    │   ├── InvalidLimitError         (also ValueError) a flow-control limit that cannot hold
    │   ├── InvalidOptionError        (also ValueError) an option's value out of its range
    │   └── PayloadTooLargeError      (also ValueError) an input or output over the limit
    ├── StateError                  the call does not fit the state of what it uses
    │   ├── InvalidStateError         a run, node, client or object that does not allow it
    │   │   └── LifecycleError          (also RuntimeError) a worker started twice, a tracked
    │   │                               transaction used once it ended
    │   ├── NotInTransactionError     a *_tx call on a connection with no open transaction
    │   └── ContextError              a handler context used outside its handler
    └── SetupError                  the database, or the way it is reached, needs fixing
        ├── SchemaNotMigratedError    the schema lacks migrations this package ships
        ├── SchemaVersionError        the schema has migrations this package does not know
        ├── ReadOnlyServerError       migrate() on a server that takes no writes (a standby?)
        ├── UnsupportedPoolerError    a pooler in transaction mode, configured in a way it breaks
        ├── UnsupportedLayoutError    on Citus: Cyclone's tables distributed, or a worker node
        └── KeyringError              a sealed payload this client has no key for (or no
                                      cryptography package to open it with)

Each error keeps the builtin base it has always had (``except ValueError`` still catches an
:class:`InvalidKeyError`); a group adds none of its own, except that everything under
:class:`InvalidInputError` is also a ``TypeError``.

Lease loss and run cancellation reach a running handler as ``asyncio.CancelledError``,
a ``BaseException``, so ``except Exception`` in user code cannot swallow them.
"""

from __future__ import annotations

import uuid


class CycloneError(Exception):
    """Base class of every error Cyclone raises on purpose."""


# Conflicts: another run holds what this call asked for.


class ConflictError(CycloneError):
    """Another run holds the key this call asked for; nothing was written."""


class SubmitConflictError(ConflictError):
    """``submit_once`` (or a keyed ``fork``) found the key's run, but its input (or what it
    forked) differs from this call's."""

    def __init__(self, name: str, key: str, run_id: uuid.UUID, *, what: str = "input") -> None:
        super().__init__(
            f"key {key!r} of workflow {name!r} belongs to run {run_id} with a different {what}"
        )
        self.name = name
        self.key = key
        self.run_id = run_id


class DuplicateError(ConflictError):
    """An active run of the same kind already holds the ``unique=`` key."""

    def __init__(self, kind: str, key: str, run_id: uuid.UUID) -> None:
        super().__init__(f"an active run {run_id} of {kind!r} already holds unique key {key!r}")
        self.kind = kind
        self.key = key
        self.run_id = run_id


class KeyContentionError(ConflictError, RuntimeError):
    """A key's run was inserted and purged again and again while the call retried: no
    answer settled (so rare it means something else keeps purging). Safe to call again."""

    def __init__(self, what: str, key: str, name: str) -> None:
        super().__init__(f"{what} key {key!r} of {name!r} kept changing hands")
        self.key = key
        self.name = name


# Outcomes of a run: result() on a run that ended without a result.


class RunOutcomeError(CycloneError):
    """``result()`` on a run that ended, or was made, without a result to give."""

    def __init__(self, message: str, run_id: uuid.UUID) -> None:
        super().__init__(message)
        self.run_id = run_id


class NoOutputError(RunOutcomeError):
    """The run has no result node, or its result node was skipped (a branch before it was
    not taken), so there is no typed result to return."""

    def __init__(self, run_id: uuid.UUID, why: str = "has no result node") -> None:
        super().__init__(f"run {run_id} {why}", run_id)


class RunFailedError(RunOutcomeError):
    """The run failed, so it has no result. ``error`` holds the cause as stored (a dict of
    ``type``, ``message``, ``attempt``, ``traceback``... for a failed attempt), ``traceback``
    the handler's traceback when it was stored (else None).

    The message says the cause in a line, the error's type and message, with the node and
    the attempt when they were stored; the traceback stays out of it (``traceback`` has it,
    as do ``run.info()`` and the dashboard's run page).
    """

    def __init__(self, run_id: uuid.UUID, error: object) -> None:
        super().__init__(f"run {run_id} failed{_cause(error)}", run_id)
        self.error = error
        found = error.get("traceback") if isinstance(error, dict) else None
        self.traceback: str | None = found if isinstance(found, str) else None


def _cause(error: object) -> str:
    """A stored error as the end of a message: ``: ValueError: boom (attempt 3)``."""
    if error is None:
        return ""
    if not isinstance(error, dict):
        return f": {error}"
    kind, message = error.get("type"), error.get("message")
    text = ": ".join(str(part) for part in (kind, message) if part not in (None, ""))
    where = []
    if error.get("node") is not None:
        where.append(f"node {error['node']!r}")
    if error.get("attempt") is not None:
        where.append(f"attempt {error['attempt']}")
    if not text:  # a stored error with neither: show what it holds, traceback left out
        text = str({k: v for k, v in error.items() if k != "traceback"})
    return f": {text}" + (f" ({', '.join(where)})" if where else "")


class RunCancelledError(RunOutcomeError):
    """The run was cancelled, so it has no result."""

    def __init__(self, run_id: uuid.UUID) -> None:
        super().__init__(f"run {run_id} was cancelled", run_id)


class RunExpiredError(RunOutcomeError):
    """The job was not started by its expiry (``expires_at=`` or ``expires_in=``), so it
    never ran and has no result."""

    def __init__(self, run_id: uuid.UUID) -> None:
        super().__init__(
            f"run {run_id} expired before a worker started it: enqueue it again, or give it "
            "a later expiry",
            run_id,
        )


# Not found: the call names something that does not exist here.


class NotFoundError(CycloneError):
    """The run, schedule, queue, kind or node the call names does not exist (or is not
    visible to this client or known to this process)."""


class RunNotFoundError(NotFoundError):
    """The run does not exist or is not visible to the client's pool.

    A run inserted in a transaction that has not committed, that rolled back, or a run
    that was purged, all look the same: not found. ``why``, when known, says more (a wait
    that saw the run, then found it gone).
    """

    def __init__(self, run_id: uuid.UUID, why: str | None = None) -> None:
        super().__init__(f"run {run_id} not found" + ("" if why is None else f": {why}"))
        self.run_id = run_id


class ScheduleNotFoundError(NotFoundError):
    """No schedule of that name is stored in the schema."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no schedule named {name!r}: `cyclone schedules ls` lists the stored schedules"
        )
        self.name = name


class UnknownQueueError(NotFoundError):
    """Flow control was asked for a queue that has no setting and that no live worker claims
    from: most likely a typo. Nothing was written."""

    def __init__(self, queue: str) -> None:
        super().__init__(
            f"queue {queue!r} is unknown: no setting or live worker uses it; check "
            f"the name, or pass create=True to configure it before its first use"
        )
        self.queue = queue


class UnknownKindError(NotFoundError):
    """A step kind, workflow, or node name that this process has not declared."""


class UnknownNodeError(UnknownKindError):
    """A node that the workflow, the run or the handler's dependencies do not have.

    A subclass of :class:`UnknownKindError`, which was raised for unknown nodes before.
    """

    def __init__(self, message: str, node: str) -> None:
        super().__init__(message)
        self.node = node


# Invalid input: a value the call cannot use; nothing was written.


class InvalidInputError(CycloneError, TypeError):
    """A payload that does not encode, or an option of the wrong type; nothing was written."""


class InvalidKeyError(InvalidInputError, ValueError):
    """A submit or unique key breaks the key rules; nothing was written."""


class InvalidNameError(InvalidInputError, ValueError):
    """A schema, queue, kind, workflow or node name that breaks its rules; nothing was written."""


class InvalidScheduleError(InvalidInputError):
    """A schedule's declaration cannot be used (bad cron, time zone, interval, policy, name);
    nothing was written."""


class InvalidLimitError(InvalidInputError, ValueError):
    """A flow-control limit that cannot hold: zero or negative, not an int, or a rate
    without its period. Nothing was written."""


class InvalidOptionError(InvalidInputError, ValueError):
    """An option of the right type whose value is out of its range (a dashboard's page size,
    a secret too short to sign with)."""


class PayloadTooLargeError(InvalidInputError, ValueError):
    """An encoded input or output is larger than the client's limit."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes encoded, over the limit of {limit} bytes")
        self.size = size
        self.limit = limit


# State: the call does not fit the current state of what it uses.


class StateError(CycloneError):
    """The call does not fit the current state of what it uses: a run or node, the client,
    a connection, a handler's context."""


class InvalidStateError(StateError):
    """The run, node, client or object is in a state that does not allow this operation."""


class LifecycleError(InvalidStateError, RuntimeError):
    """An object used outside its life: a worker started twice, a tracked transaction used
    once it committed or rolled back."""


class NotInTransactionError(StateError):
    """A ``*_tx`` call got a connection that has no open transaction.

    Cyclone never begins or commits a transaction on the caller's connection, so it refuses
    to write on one that would autocommit each statement.
    """


class ContextError(StateError):
    """A handler's context was used after the handler returned or from another task."""


# Setup: the database, or the way it is reached, needs fixing before any call can work.


class SetupError(CycloneError):
    """The database, its schema or the way it is reached is not as Cyclone needs: fix the
    deployment (migrate, upgrade, point at the primary, configure the pooler), not the call."""


def _versions(versions: list[int]) -> str:
    return ", ".join(str(v) for v in versions)


class SchemaNotMigratedError(SetupError):
    """The schema lacks migrations this version of cyclone-pg ships: the database is older
    than the code. Run ``cyclone migrate`` or ``client.migrate()``.

    ``missing`` lists them when the schema was checked (``client.check_schema()``, a worker's
    start, every ``cyclone`` command). When a statement found a Cyclone table, function or
    column missing instead, ``found`` is the server's message and ``missing`` is empty (the
    statement's failure aborted the transaction it ran in, so nothing more was asked);
    ``raise ... from`` keeps the driver's error as ``__cause__``.
    """

    def __init__(
        self, schema: str, missing: list[int], *, empty: bool, found: str | None = None
    ) -> None:
        lacks = f"lacks Cyclone migrations {_versions(missing)}"
        if empty:
            lacks = "has no Cyclone tables"
        elif found is not None:
            lacks = f"lacks Cyclone migrations this version of cyclone-pg needs ({found})"
        super().__init__(
            f"schema {schema!r} {lacks}: run `cyclone migrate` (or `await client.migrate()`)"
        )
        self.schema = schema
        self.missing = missing
        self.found = found


class SchemaVersionError(SetupError):
    """The schema has migrations this version of cyclone-pg does not know: the code is older
    than the database. ``unknown`` lists them; upgrade cyclone-pg where this runs."""

    def __init__(self, schema: str, unknown: list[int], known: int) -> None:
        super().__init__(
            f"schema {schema!r} has Cyclone migrations {_versions(unknown)}, newer than this "
            f"version of cyclone-pg knows (up to {known}): upgrade cyclone-pg on this host"
        )
        self.schema = schema
        self.unknown = unknown


class ReadOnlyServerError(SetupError):
    """``migrate()`` reached a server that takes no writes: a hot standby, or a session with
    ``default_transaction_read_only`` on. Run migrations against the primary."""

    def __init__(self, schema: str) -> None:
        super().__init__(
            f"migrating schema {schema!r}: connected to a read-only server (a standby?): run "
            "migrations against the primary; with a multi-host DSN add "
            "target_session_attrs=read-write"
        )
        self.schema = schema


class UnsupportedPoolerError(SetupError):
    """The pool goes through a connection pooler in transaction mode (PgBouncer's
    ``pool_mode = transaction``) with a setting that cannot work through it: asyncpg's
    statement cache, or LISTEN. The message names the fix."""


class UnsupportedLayoutError(SetupError):
    """Cyclone's tables are laid out in a way this release cannot run on: on a Citus
    cluster, made distributed or reference tables (they stay local to the coordinator), or
    reached on a worker node instead of the coordinator. The message names the table or
    node, and the fix (docs/scaling.md, "Citus")."""


class KeyringError(SetupError):
    """A payload is sealed with a key this client's keyring does not hold (or the client has
    no keyring, or the ``cryptography`` package is missing): the message says which key."""
