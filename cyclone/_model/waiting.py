"""The nodes of a workflow that wait (pure): for a signal, for any or all of several events,
or until a wake time; and how a node joins its definition. :class:`WaitingNodes` is a base of
``Workflow``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast, overload

import msgspec

from cyclone._model.events import NO_DEFAULT, EventNode, wait_node
from cyclone._model.nodes import Branch, Join, Node, check_new
from cyclone._model.sleeps import WakeTime, sleep_node

Out = TypeVar("Out")
P = TypeVar("P")
S = TypeVar("S", bound=msgspec.Struct)


class WaitingNodes:
    """Adding wait, event and sleep nodes to a definition of ``name`` whose nodes so far are
    ``_nodes``."""

    name: str
    _nodes: dict[str, Node[Any]]
    _layout: Any

    @overload
    def wait(
        self,
        name: str,
        *,
        payload: type[P],
        after: Sequence[Node[Any] | Branch | str] = ...,
        timeout: float | None = ...,
        on_timeout: P = ...,
        join: Join = ...,
    ) -> Node[P]: ...
    @overload
    def wait(
        self,
        name: str,
        *,
        payload: Any = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        timeout: float | None = ...,
        on_timeout: Any = ...,
        join: Join = ...,
    ) -> Node[Any]: ...
    def wait(
        self,
        name: str,
        *,
        payload: Any = Any,
        after: Sequence[Node[Any] | Branch | str] = (),
        timeout: float | None = None,
        on_timeout: Any = NO_DEFAULT,
        join: Join = "all",
    ) -> Node[Any]:
        """Add a wait node: it completes when ``client.signal(run_id, name, payload)`` comes,
        the payload its output; one that is not a ``payload`` (type) is refused unwritten.
        With ``timeout`` (seconds after it becomes reachable) it fails when no signal came,
        or completes with output ``on_timeout`` when given. ``after`` and ``join`` are as
        for :meth:`node`."""
        settings = (after, timeout, join, on_timeout)
        return self._add(wait_node(self.name, self._nodes, name, settings, payload=payload))

    def wait_any(
        self,
        name: str,
        *,
        events: Mapping[str, Any],
        after: Sequence[Node[Any] | Branch | str] = (),
        timeout: float | None = None,
        on_timeout: Any = NO_DEFAULT,
        join: Join = "all",
    ) -> EventNode[Any]:
        """Add a wait node completed by the first of several events, each with its payload
        type (``events={"approved": Approval}``), signalled as ``client.signal(run_id, name,
        payload, event="approved")``. Its output is an :class:`Event`; a signal for another
        event after that is refused. ``node.when("approved")`` branches on the event.
        ``on_timeout`` completes it at its timeout with event ``"timeout"`` and that payload.
        """
        settings = (after, timeout, join, on_timeout)
        wait = wait_node(self.name, self._nodes, name, settings, events=events)
        return cast("EventNode[Any]", self._add(wait))

    @overload
    def wait_all(
        self,
        name: str,
        *,
        events: type[S],
        after: Sequence[Node[Any] | Branch | str] = ...,
        timeout: float | None = ...,
        on_timeout: S = ...,
        join: Join = ...,
    ) -> Node[S]: ...
    @overload
    def wait_all(
        self,
        name: str,
        *,
        events: Mapping[str, Any],
        after: Sequence[Node[Any] | Branch | str] = ...,
        timeout: float | None = ...,
        on_timeout: Mapping[str, Any] = ...,
        join: Join = ...,
    ) -> Node[dict[str, Any]]: ...
    def wait_all(
        self,
        name: str,
        *,
        events: Any,
        after: Sequence[Node[Any] | Branch | str] = (),
        timeout: float | None = None,
        on_timeout: Any = NO_DEFAULT,
        join: Join = "all",
    ) -> Node[Any]:
        """Add a wait node completed once every event came (each taken once, signalled as
        for :meth:`wait_any`). ``events`` is a ``msgspec.Struct`` type whose fields are the
        events (the output is one) or a dict of names to payload types (a dict by name).
        ``on_timeout`` completes it at its timeout, with the events that came laid over it.
        """
        settings = (after, timeout, join, on_timeout)
        wait = wait_node(self.name, self._nodes, name, settings, events=events, all_of=True)
        return self._add(wait)

    def sleep(
        self,
        name: str,
        *,
        after: Sequence[Node[Any] | Branch | str] = (),
        join: Join = "all",
        sleep: dt.timedelta | float | None = None,
        until: dt.datetime | WakeTime | None = None,
    ) -> Node[dt.datetime]:
        """Add a sleep node: it completes at its wake time, holding no worker slot meanwhile,
        with the wake time as its output.

        Give one of ``sleep`` (a timedelta or seconds from when the node starts) or
        ``until``: an aware datetime, or a function ``(workflow_input, outputs)`` returning
        one, called once when the node is reached. A wake time already past completes the
        node at once. ``after`` and ``join`` are as for :meth:`node`.
        """
        return self._add(sleep_node((self.name, self._nodes), name, after, join, sleep, until))

    def _add(self, node: Node[Out]) -> Node[Out]:
        check_new(self.name, self._nodes, node)
        self._nodes[node.name] = node
        self._layout = None
        return node
