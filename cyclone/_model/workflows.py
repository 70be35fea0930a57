"""DAG workflows: the definition, adding step, map and child nodes (pure; wait, event and
sleep nodes: ``waiting``); the nodes and their checks are in ``nodes``.

What the rest of Cyclone uses of a defined workflow (its nodes for workers, the plan of a
submit, the submit calls) is :class:`~cyclone._model.submission.Submittable`, the base of
:class:`Workflow`.

Nodes can only depend on nodes defined before them, so a definition is always acyclic and
its definition order is a topological order. A submitted run stores its nodes and edges, so
it keeps the graph it was submitted with when a later deploy changes the definition.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, cast, overload

import msgspec

from cyclone._model.batches import refuse_node
from cyclone._model.errors import InvalidInputError
from cyclone._model.maps import MapSettings, map_node
from cyclone._model.nodes import (
    MAX_ITEMS,
    Branch,
    Definition,
    Join,
    Node,
    check_input,
    child_node,
    dependencies,
    join_spec,
)
from cyclone._model.retention import Retention
from cyclone._model.settled import Settled
from cyclone._model.steps import DEFAULT_MAX_ATTEMPTS, Kind
from cyclone._model.submission import Resulting, Submittable
from cyclone._model.waiting import WaitingNodes

In = TypeVar("In")
Out = TypeVar("Out")
StepIn = TypeVar("StepIn")
StepOut = TypeVar("StepOut")
P = TypeVar("P")
S = TypeVar("S", bound=msgspec.Struct)

# Every workflow this process defined, for the worker's check that a step it serves is not
# also a node of a workflow it was not given (whose nodes it would then never claim).
_DEFINED: weakref.WeakSet[Workflow[Any]] = weakref.WeakSet()


def defined_workflows() -> list[Workflow[Any]]:
    """The workflows defined in this process so far, by name."""
    return sorted(_DEFINED, key=lambda wf: wf.name)


class Workflow(Submittable[In], WaitingNodes):
    """A named DAG of steps; every ``submit`` makes a new run, ``submit_once`` one per key."""

    def __init__(self, name: str, input_type: Any, *, retention: Retention | None = None) -> None:
        super().__init__(name, input_type, retention=retention)
        _DEFINED.add(self)

    def __repr__(self) -> str:
        return f"<cyclone.{type(self).__name__} {self.name!r} nodes={list(self._nodes)}>"

    # Definition

    @overload
    def node(
        self,
        step: Kind[In, StepOut],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        input: None = ...,
        join: Join = ...,
    ) -> Node[StepOut]: ...
    @overload
    def node(
        self,
        step: Kind[StepIn, StepOut],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        input: Callable[[In, Mapping[str, Any]], StepIn],
        join: Join = ...,
    ) -> Node[StepOut]: ...
    def node(
        self,
        step: Kind[Any, Any],
        *,
        name: str | None = None,
        after: Sequence[Node[Any] | Branch | str] = (),
        input: Callable[[Any, Mapping[str, Any]], Any] | None = None,
        join: Join = "all",
    ) -> Node[Any]:
        """Add a step node running after ``after``; its name defaults to the step's.

        The handler gets the workflow input, or ``input(workflow_input, outputs)`` built
        from the decoded outputs of its dependencies. A dependency given as
        ``node.when(value)`` is a branch, taken only when that node's output is ``value``;
        with ``join="all"`` the node runs only if every dependency completed and every
        branch to it was taken (else it is skipped), with ``join="any"`` if at least one did.
        """
        if not isinstance(step, Kind):
            raise InvalidInputError(f"{step!r} is not a step or kind")
        refuse_node(step)
        check_input(f"step {step.name!r}", step.input_type, self.input_type, input)
        deps, conds = dependencies(self.name, self._nodes, after)
        return self._add(
            Node(
                name or step.name,
                step,
                deps,
                input,
                output_type=step.output_type,
                spec=join_spec(join, deps),
                conds=conds,
            )
        )

    @overload
    def map(
        self: Workflow[list[StepIn]],
        step: Kind[StepIn, StepOut] | Resulting[StepIn, StepOut],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        max_parallel: int | None = ...,
        settle: Literal[False] = ...,
        max_items: int = ...,
        join: Join = ...,
    ) -> Node[list[StepOut]]: ...
    @overload
    def map(
        self: Workflow[list[StepIn]],
        step: Kind[StepIn, StepOut] | Resulting[StepIn, StepOut],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        max_parallel: int | None = ...,
        settle: Literal[True],
        max_items: int = ...,
        join: Join = ...,
    ) -> Node[list[Settled[StepOut]]]: ...
    @overload
    def map(
        self,
        step: Kind[StepIn, StepOut] | Resulting[StepIn, StepOut],
        over: Node[Sequence[StepIn]],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        max_parallel: int | None = ...,
        settle: Literal[False] = ...,
        max_items: int = ...,
        join: Join = ...,
    ) -> Node[list[StepOut]]: ...
    @overload
    def map(
        self,
        step: Kind[StepIn, StepOut] | Resulting[StepIn, StepOut],
        over: Node[Sequence[StepIn]],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        max_parallel: int | None = ...,
        settle: Literal[True],
        max_items: int = ...,
        join: Join = ...,
    ) -> Node[list[Settled[StepOut]]]: ...
    def map(
        self,
        step: Kind[Any, Any] | Resulting[Any, Any],
        over: Node[Any] | None = None,
        *,
        name: str | None = None,
        after: Sequence[Node[Any] | Branch | str] = (),
        max_parallel: int | None = None,
        settle: bool = False,
        max_items: int = MAX_ITEMS,
        join: Join = "all",
    ) -> Node[Any]:
        """Add a map node: ``step`` runs once per item of a list, each item an input.

        The list is the output of node ``over`` (which the map runs after), or the workflow
        input when ``over`` is omitted. When the map node is reached, its item nodes
        (``name[0]``, ``name[1]``...) are created in the same transaction; at most
        ``max_parallel`` of them run at once. Its output, for the nodes after it, is the
        list of the items' outputs in item order (an empty list completes it at once).

        An item that fails its last attempt fails the run, unless ``settle=True``: then
        every item runs to its end and the output is a list of :class:`Settled`, each
        item's value or error. A list longer than ``max_items`` fails the map node.

        With a result workflow as ``step``, each item is a child run of it (as for
        :meth:`child`, with 10 attempts per item) and the output is the list of their
        results.
        """
        refuse_node(step)
        settings = MapSettings(max_parallel, settle, max_items)
        where = (self.name, self._nodes, self.input_type)
        kind = cast("Kind[Any, Any] | Definition", step)
        return self._add(map_node(where, kind, over, name, after, join, settings))

    @overload
    def child(
        self,
        workflow: Resulting[In, StepOut],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        input: None = ...,
        max_attempts: int = ...,
        join: Join = ...,
    ) -> Node[StepOut]: ...
    @overload
    def child(
        self,
        workflow: Resulting[StepIn, StepOut],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        input: Callable[[In, Mapping[str, Any]], StepIn],
        max_attempts: int = ...,
        join: Join = ...,
    ) -> Node[StepOut]: ...
    @overload
    def child(
        self,
        workflow: Workflow[In],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        input: None = ...,
        max_attempts: int = ...,
        join: Join = ...,
    ) -> Node[None]: ...
    @overload
    def child(
        self,
        workflow: Workflow[StepIn],
        *,
        name: str | None = ...,
        after: Sequence[Node[Any] | Branch | str] = ...,
        input: Callable[[In, Mapping[str, Any]], StepIn],
        max_attempts: int = ...,
        join: Join = ...,
    ) -> Node[None]: ...
    def child(
        self,
        workflow: Workflow[Any] | Resulting[Any, Any],
        *,
        name: str | None = None,
        after: Sequence[Node[Any] | Branch | str] = (),
        input: Callable[[Any, Mapping[str, Any]], Any] | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        join: Join = "all",
    ) -> Node[Any]:
        """Add a child node: it submits a run of ``workflow`` and completes with its result
        (a result workflow's typed result; ``None`` for a plain workflow).

        The child's input is the workflow input, or ``input(workflow_input, outputs)``. The
        child run is submitted in the transaction that records the node's attempt, so a
        reclaimed or retried attempt never makes a second child; the node holds no worker
        slot while the child runs. A child that fails (or is cancelled) is a failed attempt
        of the node, as is an attempt lost with its worker: with attempts left (10 by
        default, as for a step), a new child is submitted. Cancelling the run cancels its
        children.
        """
        where = (self.name, self._nodes, self.input_type)
        child = cast("Definition", workflow)
        return self._add(child_node(where, child, name, after, input, join, max_attempts))

    # What workers need

    def children(self) -> list[Workflow[Any]]:
        """The workflows its child nodes submit runs of, and theirs, each once."""
        found: dict[str, Workflow[Any]] = {}
        for node in self._nodes.values():
            child = cast("Workflow[Any] | None", node.child)
            if child is not None and child.name not in found:
                found[child.name] = child
                found.update((wf.name, wf) for wf in child.children())
        return list(found.values())
