"""One attempt of a task, and the values it can end with.

The producer claims a task and makes it a :class:`Claimed` attempt; the executor runs its
handler and turns what happened into one :data:`Outcome`; the completer writes that outcome,
fenced by the attempt's (task, claims), and says whether the database accepted it. Outcomes
are plain values: the stages hand them on and none reaches into another's state.

::

    Completed   the handler returned: complete the job or node (with the handler's own
                completion transaction, if it opened one)
    Retry       the attempt failed with attempts left: available again after a delay
    Snoozed     the handler raised Snooze: available again after its delay, attempt refunded
    HandedBack  shutdown cancelled the handler: available again at once, attempt refunded
    Failed      the last attempt failed, or its input can no longer be decoded: the job or
                node fails, and its run with it
    Lost        the attempt lost its task (run cancelled, lease taken over): nothing to write
"""

from __future__ import annotations

import datetime as dt
import traceback
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec

from cyclone._model import codec

if TYPE_CHECKING:
    from cyclone._model.keyring import Keyring
    from cyclone._worker.completion import CompletionTx

_TRACEBACK_LIMIT = 8000
_MESSAGE_LIMIT = 2000


@dataclass(frozen=True)
class Claiming:
    """How every producer of a worker claims: as ``worker_id``, tasks of ``kinds`` and nodes
    of ``workflows``, each for a lease of ``lease`` seconds, at most ``claim_batch`` a claim,
    polling every ``poll_interval`` seconds at the latest; beyond the free slots of a queue
    whose handlers are short only with ``ahead``."""

    worker_id: str
    kinds: list[str]
    workflows: list[str]
    lease: float
    claim_batch: int
    poll_interval: float
    ahead: bool


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task this worker claimed: one attempt of a job or workflow node."""

    id: int
    run_id: uuid.UUID
    node: str | None
    kind: str
    queue: str
    attempt: int
    max_attempts: int
    claims: int
    run_name: str
    input: str
    deps: str | None
    trace: str | None = None
    worker: str = ""
    # When this worker claimed it (its clock): the attempt's start, as its failure records.
    claimed_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    @classmethod
    def from_row(cls, row: asyncpg.Record, *, queue: str, worker: str) -> Claimed:
        """The attempt a row of ``task_claim`` stands for, claimed from ``queue`` by ``worker``."""
        return cls(
            id=row["id"],
            run_id=row["run_id"],
            node=row["node"],
            kind=row["kind"],
            queue=queue,
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            claims=row["claims"],
            run_name=row["name"],
            input=row["input"],
            deps=row["deps"],
            trace=row["trace"],
            worker=worker,
        )

    def __str__(self) -> str:
        """``attempt 2/5 of order.reserve (run ..., node reserve)``, for log messages."""
        return describe_attempt(self.attempt, self.max_attempts, self.kind, self.run_id, self.node)

    @property
    def key(self) -> tuple[int, int]:
        """The attempt's identity: its task and the claim that started it."""
        return (self.id, self.claims)

    def span_attributes(self) -> dict[str, Any]:
        """Attributes for the handler's span."""
        return {
            "cyclone.run_id": str(self.run_id),
            "cyclone.kind": self.kind,
            "cyclone.node": self.node or "",
            "cyclone.attempt": self.attempt,
            "cyclone.queue": self.queue,
        }

    def log_fields(self) -> dict[str, Any]:
        """Structured fields for log records (``extra``): the keys docs/observability.md lists."""
        return {
            "run_id": str(self.run_id),
            "kind": self.kind,
            "node": self.node,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "queue": self.queue,
            "worker": self.worker,
        }


def describe_attempt(
    attempt: int, max_attempts: int, kind: str, run_id: uuid.UUID, node: str | None
) -> str:
    """How log messages name an attempt: ``attempt 2/5 of order.reserve (run ..., node x)``."""
    where = "" if node is None else f", node {node}"
    return f"attempt {attempt}/{max_attempts} of {kind} (run {run_id}{where})"


def error_type(exc: BaseException, kind: str | None = None) -> str:
    """The type an attempt's error is kept as.

    asyncpg raises ``InternalClientError`` for a statement sent on a connection the server
    ended before asyncpg noticed: what happened is that the connection was lost.
    """
    if kind is not None:
        return kind
    if isinstance(exc, asyncpg.InternalClientError):
        return "ConnectionLost"
    return type(exc).__qualname__


def error_message(exc: BaseException) -> str:
    """The message an attempt's error is kept with (see :func:`error_type`)."""
    if isinstance(exc, asyncpg.InternalClientError):
        return f"the connection to PostgreSQL was lost under the handler (asyncpg: {exc})"
    return str(exc)


def error_record(
    claimed: Claimed, exc: BaseException, *, kind: str | None = None, cipher: Keyring | None = None
) -> str:
    """The JSON kept for a failed attempt: type, message, traceback, when it started (was
    claimed) and when it failed. With ``cipher``, the message and the traceback (which carry
    the handler's values) are sealed; the type, attempt and times stay clear."""
    tb = "".join(traceback.format_exception(exc))
    # jsonb cannot store NUL or lone surrogates; an error that could not be stored
    # would be lost, and one of any size would bloat every read of the run.
    message: str | msgspec.Raw = codec.storable_text(error_message(exc), _MESSAGE_LIMIT)
    trace: str | msgspec.Raw = codec.storable_text(tb, _TRACEBACK_LIMIT)
    if cipher is not None:
        message = msgspec.Raw(cipher.seal(codec.encode_plain(message)))
        trace = msgspec.Raw(cipher.seal(codec.encode_plain(trace)))
    return codec.encode_plain(
        {
            "attempt": claimed.attempt,
            "node": claimed.node,
            "type": error_type(exc, kind),
            "message": message,
            "traceback": trace,
            "started_at": claimed.claimed_at.isoformat(),
            "at": dt.datetime.now(dt.UTC).isoformat(),
        }
    )


class CompletionAborted(Exception):
    """A completion transaction ended without committing, certainly: the handler's writes
    were rolled back with it, and the attempt fails with this as its error."""


class ConnectionLost(CompletionAborted, ConnectionError):
    """The connection under a completion transaction was lost before its commit."""


def aborted_completion(exc: BaseException) -> CompletionAborted:
    """The error kept for an attempt whose completion transaction the server refused (a
    statement in it failed, or its COMMIT did): nothing of it was written."""
    aborted = CompletionAborted(
        f"the completion transaction failed and was rolled back ({type(exc).__name__}: "
        f"{exc}); the handler's writes in it were rolled back"
    )
    aborted.__cause__ = exc
    return aborted


def lost_completion(exc: BaseException) -> ConnectionLost:
    """The error kept for an attempt whose completion transaction lost its connection."""
    lost = ConnectionLost(
        "the connection of the completion transaction was lost before it committed "
        f"({type(exc).__name__}: {exc}); the handler's writes in it were rolled back"
    )
    lost.__cause__ = exc
    return lost


@dataclass(frozen=True, slots=True)
class Ended:
    """What every outcome carries: the attempt it ends."""

    claimed: Claimed

    @property
    def name(self) -> str:
        """The outcome as metrics and the log's ``outcome`` field call it."""
        return _CALLED[type(self)][0]

    @property
    def noun(self) -> str:
        """The outcome as the log's sentences call it ("the retry of attempt ...")."""
        return _CALLED[type(self)][1]


@dataclass(frozen=True, slots=True)
class Completed(Ended):
    """The handler returned ``output`` (encoded); ``completion`` if it opened one."""

    output: str
    completion: CompletionTx | None = None


@dataclass(frozen=True, slots=True)
class Retry(Ended):
    """The attempt failed with attempts left: try again after ``delay`` seconds."""

    delay: float
    error: str  # the error record kept for the attempt
    exc: BaseException
    what: str  # "failed: ValueError: boom" or "timed out after 5 s", for the log


@dataclass(frozen=True, slots=True)
class Snoozed(Ended):
    """The handler raised ``Snooze(delay)``: run again after ``delay``, attempt refunded."""

    delay: float


@dataclass(frozen=True, slots=True)
class HandedBack(Ended):
    """Shutdown cancelled the handler (or came before a task claimed ahead started): the task
    is available again at once, attempt refunded."""

    started: bool = True  # False: claimed ahead, or waiting for its batch: no handler ran


@dataclass(frozen=True, slots=True)
class Failed(Ended):
    """The attempt failed for good (last attempt, or input that cannot be decoded)."""

    error: str
    exc: BaseException
    what: str
    reason: str = "no attempts left"  # why no further attempt is made, for the log
    settled: bool = False  # an item of a map that settles its items: its run goes on


@dataclass(frozen=True, slots=True)
class Lost(Ended):
    """The attempt lost its task (its run ended, or its lease was taken over)."""


Outcome = Completed | Retry | Snoozed | HandedBack | Failed | Lost
Released = Retry | Snoozed | HandedBack
"""The outcomes that put the task back in its queue (one statement for a batch of them)."""

# How each outcome is called: its name (metrics, the log's outcome field) and its noun.
_CALLED: dict[type[Ended], tuple[str, str]] = {
    Completed: ("completed", "completion"),
    Retry: ("retried", "retry"),
    Snoozed: ("snoozed", "snooze"),
    HandedBack: ("cancelled", "hand-back"),
    Failed: ("failed", "failure"),
    Lost: ("cancelled", "loss"),
}
