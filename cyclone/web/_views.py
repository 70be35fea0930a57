"""What the run templates show, worked out from the read models: a run's failure, each
attempt with its times, the actions that apply to the run's state, and the output's text
when there is none."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone._model.handles import NodeInfo, RunInfo, RunPayloads, RunState, released
from cyclone._model.states import ReportedNodeState


def stored_time(value: Any) -> dt.datetime | None:
    """A time kept in an error record (ISO text), or None when it has none or is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One failed attempt as its error record holds it; ``took`` is in seconds, None when the
    record does not say when the attempt started."""

    number: int | None
    type: str
    message: str
    traceback: str
    at: dt.datetime | None
    took: float | None
    anchor: str
    released: str | None = None  # who released it and why, when its worker was lost

    @classmethod
    def of(cls, record: Mapping[str, Any], anchor: str = "") -> Attempt:
        """The attempt ``record`` (an entry of a node's ``errors``, or a run's ``error``)
        describes; ``anchor`` is the id of its place on the page ("": none)."""
        number = record.get("attempt")
        number = number if isinstance(number, int) and not isinstance(number, bool) else None
        at = stored_time(record.get("at"))
        started = stored_time(record.get("started_at"))
        took = (at - started).total_seconds() if at and started and at >= started else None
        return cls(
            number=number,
            type=_text(record.get("type")) or "error",
            message=_text(record.get("message")),
            traceback=_text(record.get("traceback")),
            at=at,
            took=took,
            anchor=anchor,
            released=released(record),
        )


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a run failed: the error, and the node whose attempt it was (None when it was no
    attempt's: a passed deadline, say). An attempt's error is listed under its node,
    traceback included, so the summary links there instead of repeating it."""

    error: Attempt
    node: str | None


def failure(info: RunInfo) -> Failure | None:
    """The run's failure, found on the node whose attempt it was."""
    if info.error is None:
        return None
    for i, n in enumerate(info.nodes):
        if info.error in n.errors:
            anchor = _anchor(i, n.errors.index(info.error))
            return Failure(Attempt.of(info.error, anchor), n.name)
    return Failure(Attempt.of(info.error), None)


def _anchor(node: int, error: int) -> str:
    # Node names may hold any character, and a retried node numbers its attempts from 1
    # again: the anchor names the node and the error by their positions.
    return f"attempt-{node}-{error}"


def attempts(nodes: Sequence[NodeInfo]) -> dict[str, list[Attempt]]:
    """Each node's failed attempts, newest first."""
    return {
        n.name: [Attempt.of(e, _anchor(i, j)) for j, e in reversed(list(enumerate(n.errors)))]
        for i, n in enumerate(nodes)
    }


@dataclass(frozen=True, slots=True)
class RunActions:
    """The actions that apply to a run in its state: the API refuses the others."""

    retry_all: bool
    cancel: bool
    retry_nodes: frozenset[str]
    fork: bool = False  # an ended workflow run forks from any of its nodes


def run_actions(info: RunInfo) -> RunActions:
    """Retry for a failed run with failed nodes (one node at a time for a workflow's), cancel
    for a pending or running one, fork for an ended workflow run."""
    failed = frozenset(n.name for n in info.nodes if n.state == ReportedNodeState.FAILED)
    retry = info.state is RunState.FAILED and bool(failed)
    return RunActions(
        retry_all=retry,
        cancel=info.state in (RunState.PENDING, RunState.RUNNING),
        retry_nodes=failed if retry and not info.job else frozenset(),
        fork=info.state.terminal and not info.job,
    )


def no_output(info: RunInfo, payloads: RunPayloads) -> str | None:
    """What the page says in place of the run's output, or None to show the output (a
    completed job's, ``null`` included)."""
    if payloads.output is not None:
        return None
    if info.state is RunState.FAILED:
        return "No output: the run failed."
    if info.state is RunState.CANCELLED:
        return "No output: the run was cancelled."
    if info.state is RunState.EXPIRED:
        return "No output: the job expired before it started."
    if info.state is not RunState.COMPLETED:
        return "None yet: the run has not finished."
    if info.job:
        return None
    # The read model cannot tell a result node that returned null from no result node.
    return "No output: this workflow has no result node, or its result is null."
