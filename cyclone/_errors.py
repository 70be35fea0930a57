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
    └── PayloadTooLargeError      (also ValueError) an input or output over the client limit

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


class PayloadTooLargeError(CycloneError, ValueError):
    """An encoded input or output is larger than the client's limit."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes encoded, over the limit of {limit} bytes")
        self.size = size
        self.limit = limit
