"""How long ended runs are kept: :class:`Retention`, for a client or one kind or workflow."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cyclone._model.errors import InvalidInputError
from cyclone._model.handles import RunState
from cyclone._model.options import validate_int

# Runs deleted per purge statement: each sweep holds its locks only briefly.
PURGE_BATCH = 1000

KEEP_NOTHING = dt.timedelta(0)
"""``Retention(completed=KEEP_NOTHING)``: a completed run is not kept at all."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How long ended runs are kept before the workers' sweeper deletes them.

    Each age counts from the run's end; ``None`` keeps runs in that state forever. Give it to
    the client (``Client(retention=...)``: every name) or to one step kind or workflow
    (``@cyclone.step(..., retention=...)``, ``cyclone.define(..., retention=...)``): a name's
    own retention replaces the client's for its runs, every state at once.

    ``completed=KEEP_NOTHING`` (a zero age) keeps nothing once completed: a standalone job's
    run is deleted by the statement that completes it, so a completed run of that kind never
    exists (``run.wait()`` and ``run.status()`` then raise :class:`RunNotFoundError`); a
    workflow run goes at the next maintenance pass. Its failed, cancelled and expired runs
    follow their own ages.

    A run's submit key stays taken while the run is kept, so keep runs longer than a caller
    may retry a request. ``batch`` caps the rows deleted per statement, so each sweep holds
    its locks only briefly.
    """

    completed: dt.timedelta | None = None
    failed: dt.timedelta | None = None
    cancelled: dt.timedelta | None = None
    expired: dt.timedelta | None = None
    batch: int = PURGE_BATCH

    def __post_init__(self) -> None:
        for name in ("completed", "failed", "cancelled", "expired"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, dt.timedelta) or value < dt.timedelta(0)
            ):
                raise InvalidInputError(
                    f"Retention.{name} must be a non-negative timedelta or None (kept forever)"
                    f", got {value!r}"
                )
        validate_int(self.batch, what="Retention.batch", low=1)

    @property
    def keeps_nothing(self) -> bool:
        """Whether a completed run is deleted as it completes (``completed=KEEP_NOTHING``)."""
        return self.completed == KEEP_NOTHING

    def ages(self) -> list[tuple[RunState, dt.timedelta]]:
        """Each state with a retention, and its age."""
        return [
            (state, age)
            for state, age in (
                (RunState.COMPLETED, self.completed),
                (RunState.FAILED, self.failed),
                (RunState.CANCELLED, self.cancelled),
                (RunState.EXPIRED, self.expired),
            )
            if age is not None
        ]

    def seconds(self) -> tuple[float | None, float | None, float | None, float | None]:
        """The four ages in seconds (completed, failed, cancelled, expired), None: forever."""
        return (
            _secs(self.completed),
            _secs(self.failed),
            _secs(self.cancelled),
            _secs(self.expired),
        )


def _secs(age: dt.timedelta | None) -> float | None:
    return None if age is None else age.total_seconds()


def check_retention(value: object, *, what: str) -> Retention | None:
    """``value`` if it is a :class:`Retention` or None; else a clear error."""
    if value is not None and not isinstance(value, Retention):
        raise InvalidInputError(f"{what} must be a cyclone.Retention or None, got {value!r}")
    return value


@dataclass(frozen=True)
class Retentions:
    """The retentions a worker applies: the client's (``client``: every name without one of
    its own) and each name's own among the kinds and workflows it defines (``known``)."""

    client: Retention | None
    own: Mapping[str, Retention] = field(default_factory=dict)
    known: tuple[str, ...] = ()

    def of(self, name: str) -> Retention | None:
        """The retention that applies to runs of ``name``."""
        return self.own.get(name, self.client)

    def discarding(self, kinds: Iterable[str]) -> frozenset[str]:
        """Those of ``kinds`` whose completed jobs keep nothing."""
        return frozenset(k for k in kinds if (r := self.of(k)) is not None and r.keeps_nothing)
