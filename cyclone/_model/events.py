"""Typed wait nodes (pure): a wait node's declared payload type, the nodes that wait for any
or all of several named events, the value a timeout completes them with, and the check of
a signal against what its node declares.

What a wait node stores (its spec and its ``signal`` column):

- a plain wait node (``wf.wait``): the signal is the payload, and the node's output;
- any of several events (``wf.wait_any``): spec ``{"events": {"names": [...], "all":
  false}}``; the first signal stores ``{"name": event, "payload": payload}`` (its output, an
  :class:`Event`); a later one finds the signal taken and is refused;
- all of them (``wf.wait_all``): spec ``"all": true``; each signal adds ``{event:
  payload}`` to the stored object, and the node completes once every event is in it.

``on_timeout`` is kept in the spec as the output a timeout writes (for an any-of node, the
event named ``"timeout"``; for an all-of node, the events that came are laid over it).

A signal is checked against the node's declared type in the process that sends it, which
knows the type only when it defined the workflow (:func:`declared_wait`). Elsewhere the
payload is stored unchecked, and the decode in the node that reads it is the check.
"""

# No ``from __future__ import annotations``: msgspec reads Event's annotations in the module
# the class reports (``cyclone``), where a string "P" would name nothing.
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union, cast

import msgspec

from cyclone._model import codec
from cyclone._model.errors import InvalidInputError
from cyclone._model.keys import validate_name
from cyclone._model.nodes import Branch, Join, Node, dependencies, join_spec
from cyclone._model.options import seconds

P = TypeVar("P")

TIMEOUT = "timeout"
"""The event name an any-of wait node's timeout completes it with, when it has
``on_timeout``: ``node.when("timeout")`` is the branch taken then."""

NO_DEFAULT: Any = object()  # ``on_timeout`` not given: the timeout fails the run


class Event(msgspec.Struct, Generic[P], frozen=True, tag_field="name", tag=False):
    """Which event completed an any-of wait node (``wf.wait_any``), and its payload.

    ``name`` is the event's name (``"timeout"`` when ``on_timeout`` completed it) and
    ``payload`` its payload, decoded as the type that event declares, so
    ``isinstance(event.payload, Approval)`` tells the events apart as well as ``name`` does.
    """

    payload: P

    @property
    def name(self) -> str:
        """The event's name."""
        return cast(str, self.__struct_config__.tag)

    def __repr__(self) -> str:
        return f"cyclone.Event(name={self.name!r}, payload={self.payload!r})"


class EventNode(Node[Event[P]]):
    """An any-of wait node (``wf.wait_any``): a :class:`Node` whose :meth:`when` takes the
    name of an event."""

    __slots__ = ()

    def when(self, value: str) -> Branch:  # type: ignore[override]
        """This node as a dependency taken only when event ``value`` came (or ``"timeout"``,
        when ``on_timeout`` completed the node)."""
        names = [*(self.events or ()), *([TIMEOUT] if "on_timeout" in (self.spec or {}) else [])]
        if isinstance(value, str) and value not in names:
            raise InvalidInputError(
                f"wait node {self.name!r} has no event {value!r} to branch on: it has "
                + ", ".join(map(repr, names))
            )
        return Branch(self, value)


def event_types(events: object, *, all_of: bool) -> dict[str, Any]:
    """The declared events: a mapping of names to payload types, or (``wait_all``) a
    ``msgspec.Struct`` type whose fields are the events."""
    if all_of and isinstance(events, type) and issubclass(events, msgspec.Struct):
        found = {f.encode_name: f.type for f in msgspec.structs.fields(events)}
    elif isinstance(events, Mapping):
        found = dict(events)
    else:
        raise InvalidInputError(
            "events= takes a dict of event names to payload types, such as "
            '{"approved": Approval, "rejected": Rejection}'
            + (", or a msgspec.Struct type whose fields are the events" if all_of else "")
        )
    if not found:
        raise InvalidInputError("events= names no event: give at least one")
    for name, tp in found.items():
        validate_name(name, what="an event name")
        codec.check_type(tp, what=f"the payload of event {name!r}")
    if not all_of and TIMEOUT in found:
        raise InvalidInputError(f"{TIMEOUT!r} is the event a timeout makes: rename that event")
    return found


def any_output_type(events: Mapping[str, Any], on_timeout: object) -> Any:
    """The output type of an any-of node: a union of :class:`Event`, one per event."""
    members = {**events, **({} if on_timeout is NO_DEFAULT else {TIMEOUT: Any})}
    return Union[  # noqa: UP007 (a union built at run time)
        tuple(
            types.new_class(
                f"Event[{n}]",
                (Event[tp],),  # type: ignore[valid-type]
                {"tag": n, "tag_field": "name"},
                lambda ns: ns.update(__module__="cyclone"),
            )
            for n, tp in members.items()
        )
    ]


def wait_node(
    workflow: str,
    nodes: Mapping[str, Node[Any]],
    name: str,
    settings: tuple[Sequence[Node[Any] | Branch | str], float | None, Join, object],
    *,
    payload: Any = Any,
    events: object = None,
    all_of: bool = False,
) -> Node[Any]:
    """A wait node of ``workflow`` (with ``nodes`` so far), checked: plain (of ``payload``),
    any-of or (``all_of``) all-of ``events``. ``settings``: after, timeout, join, on_timeout."""
    after, timeout, join, on_timeout = settings
    wait_timeout = None if timeout is None else seconds(timeout, what="timeout")
    if on_timeout is not NO_DEFAULT and wait_timeout is None:
        raise InvalidInputError(f"wait node {name!r} has on_timeout= but no timeout=: give both")
    deps, conds = dependencies(workflow, nodes, after)
    found = None if events is None else event_types(events, all_of=all_of)
    out: Any = payload
    if found is None:
        codec.check_type(payload, what=f"the payload of wait node {name!r}")
    elif all_of:
        out = events if isinstance(events, type) else dict[str, Any]
    else:
        out = any_output_type(found, on_timeout)
    node_spec = spec(
        join_spec(join, deps),
        found,
        all_of=all_of,
        on_timeout=on_timeout,
        output_type=out,
        node=name,
    )
    cls = EventNode if found is not None and not all_of else Node
    return cls(name, None, deps, None, wait_timeout, out, node_spec, conds=conds, events=found)


def spec(
    base: Mapping[str, Any] | None,
    events: Mapping[str, Any] | None,
    *,
    all_of: bool,
    on_timeout: object,
    output_type: Any,
    node: str,
) -> dict[str, Any] | None:
    """A wait node's spec: its join's, its events' names, and the output its timeout writes
    (``on_timeout`` checked against the type of that output)."""
    found: dict[str, Any] = dict(base or {})
    if events is not None:
        found["events"] = {"names": list(events), "all": all_of}
    if on_timeout is not NO_DEFAULT:
        what = f"on_timeout of wait node {node!r}"
        limit = codec.DEFAULT_PAYLOAD_LIMIT
        if events is not None and not all_of:
            value = codec.encode(on_timeout, Any, what=what, limit=limit)
            found["on_timeout"] = {"name": TIMEOUT, "payload": msgspec.json.decode(value)}
        else:
            value = codec.encode(on_timeout, output_type, what=what, limit=limit)
            found["on_timeout"] = msgspec.json.decode(value)
    return found or None


def is_typed(node: Node[Any]) -> bool:
    """Whether ``node`` is a wait node whose signals a sender checks."""
    return node.kind is None and (node.output_type is not Any or bool(node.events))


def declared_wait(workflows: list[Any], workflow: str | None, node: str) -> Node[Any] | None:
    """The typed wait node ``node`` of the workflow named ``workflow`` among ``workflows``
    (those defined in this process), or None when this process does not know it."""
    for wf in workflows:
        if wf.name == workflow:
            found = wf.get_node(node)
            return found if found is not None and is_typed(found) else None
    return None


def signal_text(
    declared: Node[Any] | None, node: str, payload: Any, event: str | None, limit: int
) -> str:
    """The JSON text a signal stores, checked against ``declared`` (None: unchecked).

    ``payload`` is a value, or ``msgspec.Raw`` JSON text (the CLI's and the dashboard's),
    decoded as the declared type first.
    """
    tp: Any = Any
    what = "signal payload"
    if declared is not None and declared.events:
        if event is None or event not in declared.events:
            known = ", ".join(repr(name) for name in declared.events)
            given = "no event" if event is None else f"event {event!r}"
            raise InvalidInputError(
                f"wait node {node!r} waits for events {known}, and {given} is not one: "
                f'signal one of them, as client.signal(run_id, {node!r}, payload, event="...")'
            )
        tp, what = declared.events[event], f"the payload of event {event!r}"
    elif declared is not None:
        if event is not None:
            raise InvalidInputError(
                f"wait node {node!r} waits for one signal, not for events: leave event= out"
            )
        tp = declared.output_type
    if isinstance(payload, msgspec.Raw):  # JSON text: decoded as the type, to check it
        try:
            payload = codec.decode(bytes(payload), tp)
        except msgspec.DecodeError as exc:
            raise InvalidInputError(f"{what} must be {codec.type_name(tp)}: {exc}") from None
    return codec.encode(payload, tp, what=what, limit=limit)


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal to send: its node, payload and event, checked against the node's declared
    type once the run's workflow name is known (:meth:`text`). ``workflows`` are those this
    process defined with a typed wait node of that name: with none, there is nothing to check
    against and the run's name need not be read."""

    node: str
    payload: Any
    event: str | None
    limit: int
    seal: Callable[[str], str] | None
    workflows: list[Any]

    @classmethod
    def of(
        cls,
        workflows: list[Any],
        node: str,
        payload: Any,
        event: str | None,
        *,
        limit: int,
        seal: Callable[[str], str] | None,
    ) -> "Signal":
        """A signal to ``node``, checked against the typed wait nodes of that name among
        ``workflows``; its names are checked here."""
        validate_name(node, what="node")
        if event is not None:
            validate_name(event, what="an event name")
        typed = [wf for wf in workflows if (n := wf.get_node(node)) is not None and is_typed(n)]
        return cls(node, payload, event, limit, seal, typed)

    def text(self, workflow: str | None) -> str:
        """The JSON text to store for a run of ``workflow`` (None: unchecked), sealed when
        the client seals payloads."""
        declared = declared_wait(self.workflows, workflow, self.node)
        text = signal_text(declared, self.node, self.payload, self.event, self.limit)
        return text if self.seal is None else self.seal(text)
