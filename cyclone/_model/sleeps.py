"""Sleep nodes (pure): a node that completes at its wake time, holding no worker slot while
it sleeps.

A sleep node is a node with a tiny step, :class:`SleepStep`, whose attempt only says when
to wake: its input (built by the node's input function, as any node's is) is the wake time,
or ``None`` for ``sleep=``, which counts from the attempt's completion by the database's
clock. That completion puts the node to sleep (``waiting``, its wake time in the row's
``wait_until``, the column the worker's timer watches) instead of completing it, so the
node holds no slot and survives restarts; the timer completes it at the wake time, with the
wake time as its output. A wake time already past completes it in the same transaction.

So user code (an ``until=`` function of the workflow input and the outputs before it) runs
where every node's input function runs: in a worker serving the workflow, with the decoded
outputs at hand. It runs once: the wake time it returned is stored, and a retry of the run
after the node went to sleep does not call it again.
"""

from __future__ import annotations

import datetime as dt
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cyclone._model.context import HandlerContext
from cyclone._model.errors import InvalidInputError
from cyclone._model.nodes import Branch, Join, Node, dependencies, join_spec
from cyclone._model.options import seconds
from cyclone._model.steps import DEFAULT_QUEUE, Kind, Step

LONGEST = dt.timedelta(days=36_500)
"""The longest ``sleep=``: a hundred years."""
WakeTime = Callable[[Any, Mapping[str, Any]], dt.datetime]
"""An ``until=`` function: ``(workflow_input, outputs) -> aware datetime``."""


class SleepStep(Step[dt.datetime | None, dt.datetime | None]):
    """The step a sleep node's attempt runs: it hands its input, the wake time (``None``:
    the node's ``sleep=`` from now), on as its output, which the completion stores as the
    node's wake time. One per queue (``SleepStep.on``), named after it."""

    PREFIX = "cyclone.sleep:"

    def __init__(self, queue: str) -> None:
        when = dt.datetime | None
        Kind.__init__(self, self.PREFIX + queue, when, when, queue=queue, max_attempts=3)
        self.handler = self._wake_time
        self.is_sync = False
        self.timeout = None
        self.retention = None  # it makes no runs of its own name

    @classmethod
    def on(cls, queue: str) -> SleepStep:
        """The sleep step of ``queue``: the same object every time."""
        if (found := _SLEEP_STEPS.get(queue)) is None:
            found = _SLEEP_STEPS[queue] = cls(queue)
        return found

    async def _wake_time(self, ctx: HandlerContext[Any], wake: dt.datetime | None) -> Any:
        return wake


# Each queue's sleep step, made once: a worker refuses two different steps of one name.
_SLEEP_STEPS: weakref.WeakValueDictionary[str, SleepStep] = weakref.WeakValueDictionary()


def sleep_node(
    where: tuple[str, Mapping[str, Node[Any]]],
    name: str,
    after: Sequence[Node[Any] | Branch | str],
    join: Join,
    sleep: dt.timedelta | float | None,
    until: dt.datetime | WakeTime | None,
) -> Node[dt.datetime]:
    """The sleep node ``name`` of a workflow, checked (``where``: the workflow's name and its
    nodes so far). Its attempts run on the queue of the workflow's first step node so far
    (``default`` when there is none)."""
    workflow, nodes = where
    if (sleep is None) == (until is None):
        raise InvalidInputError(
            f"sleep node {name!r} takes one of sleep= (a timedelta or seconds) or until= "
            "(an aware datetime, or a function (workflow_input, outputs) -> aware datetime)"
        )
    deps, conds = dependencies(workflow, nodes, after)
    spec: dict[str, Any] = dict(join_spec(join, deps) or {})
    if sleep is not None:
        spec["sleep"] = {"seconds": _duration(sleep, name)}
        input_fn: WakeTime | Callable[[Any, Mapping[str, Any]], None] = _from_now
    elif isinstance(until, dt.datetime):
        spec["sleep"] = {}
        input_fn = _At(aware(until, name))
    elif callable(until):
        spec["sleep"] = {}
        input_fn = _Computed(until, name)
    else:
        raise InvalidInputError(
            f"until= of sleep node {name!r} must be an aware datetime or a function "
            f"(workflow_input, outputs) -> aware datetime, not {until!r}"
        )
    queue = next((n.kind.queue for n in nodes.values() if n.kind is not None), DEFAULT_QUEUE)
    return Node(
        name,
        SleepStep.on(queue),
        deps,
        input_fn,
        output_type=dt.datetime,
        spec=spec,
        conds=conds,
    )


def aware(value: object, name: str) -> dt.datetime:
    """``value`` as the wake time of sleep node ``name``: an aware datetime."""
    if not isinstance(value, dt.datetime):
        raise InvalidInputError(
            f"the wake time of sleep node {name!r} must be an aware datetime, not {value!r}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(
            f"the wake time of sleep node {name!r} must be timezone-aware (naive datetimes "
            "are ambiguous): give it a tzinfo, such as datetime.UTC"
        )
    return value


def _duration(sleep: object, name: str) -> float:
    """``sleep=`` in seconds: a timedelta or a number, at most :data:`LONGEST`."""
    value = seconds(sleep, what=f"sleep= of sleep node {name!r}")
    if not value <= LONGEST.total_seconds():  # inf too: the database could not add it
        raise InvalidInputError(
            f"sleep= of sleep node {name!r} is longer than {LONGEST.days} days: give "
            "until= a datetime instead"
        )
    return value


def _from_now(workflow_input: Any, outputs: Mapping[str, Any]) -> None:
    return None  # the completion adds sleep= to the database's clock


class _At:
    """A fixed wake time, as a node input function."""

    def __init__(self, at: dt.datetime) -> None:
        self.at = at

    def __call__(self, workflow_input: Any, outputs: Mapping[str, Any]) -> dt.datetime:
        return self.at


class _Computed:
    """A user's ``until=`` function, its result checked."""

    def __init__(self, fn: WakeTime, name: str) -> None:
        self.fn = fn
        self.name = name

    def __call__(self, workflow_input: Any, outputs: Mapping[str, Any]) -> dt.datetime:
        return aware(self.fn(workflow_input, outputs), self.name)
