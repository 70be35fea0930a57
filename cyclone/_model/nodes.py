"""A workflow's nodes (pure): step, wait and child nodes, the branches between them, and
the checks that a definition's nodes and dependencies are sound (map nodes: ``maps.py``).

A child node's spec is ``{"child": {...}}``; its attempt runs a :class:`ChildStep`, which
submits the child run. A branch is an edge with a condition: the parent output, as JSON, on
which it is taken.
"""

from __future__ import annotations

import typing
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from cyclone._model import codec
from cyclone._model.context import HandlerContext
from cyclone._model.errors import InvalidInputError, UnknownNodeError
from cyclone._model.keys import validate_name
from cyclone._model.options import validate_int
from cyclone._model.steps import Kind, Step


class Definition(Protocol):
    """What a child node needs of the workflow it runs (a :class:`cyclone.Workflow`)."""

    name: str
    input_type: Any

    def steps(self) -> list[Step[Any, Any]]:
        """Its steps with handlers, in definition order."""
        ...


# A node only gives its output out: a Node[bool] can be the result of a workflow of int.
Out_co = TypeVar("Out_co", covariant=True)

WAIT_QUEUE = "-"  # wait nodes are never claimed; the column wants a value
MAX_ITEMS = 10_000
"""The default bound on a map node's items (``max_items=``): a list longer than this fails the
map node, and its run, with an error that says so."""
Join = Literal["all", "any"]


@dataclass(frozen=True, slots=True)
class Node(Generic[Out_co]):
    """A node of a workflow: a step, a map node (a step run once per item of a list), or a
    wait node (``kind is None``) completed by a signal (or by the events in ``events``).

    ``Out_co`` is its output type: ``wf.node(step)`` of a ``Step[In, int]`` is a ``Node[int]``,
    which ``ctx.output(node)`` returns as an ``int``; ``wf.map(step, ...)`` of it is a
    ``Node[list[int]]``; a wait node is a ``Node`` of its payload type (``Any`` undeclared).
    """

    name: str
    kind: Kind[Any, Any] | None
    after: tuple[str, ...]
    input_fn: Callable[[Any, Mapping[str, Any]], Any] | None = None
    timeout: float | None = None
    output_type: Any = Any
    spec: Mapping[str, Any] | None = None  # a map node's settings, a join of "any"
    conds: Mapping[str, str] = field(default_factory=dict)  # parent: the output (JSON) taken
    events: Mapping[str, Any] | None = None  # a wait node's events and their payload types

    # The value is of the node's output type: a Node[bool] takes True or False. (A covariant
    # type in a parameter is safe here: the node only compares the value with its output.)
    def when(self, value: Out_co) -> Branch:  # type: ignore[misc]
        """This node as a dependency taken only when its output equals ``value``: the branch
        ``value`` of a node whose output says which way to go (``after=[check.when("refund")]``).
        A dependent node whose branch is not taken is skipped."""
        return Branch(self, value)

    @property
    def branches_on_event(self) -> bool:
        """Whether a branch from it compares the name of an event (a node that waits for any
        of several events), not its output."""
        return self.spec is not None and self.spec.get("events", {}).get("all") is False

    @property
    def branch_type(self) -> Any:
        """The type of what a branch from it compares: its output, or an event's name."""
        return str if self.branches_on_event else self.output_type

    @property
    def is_map(self) -> bool:
        """Whether this is a map node."""
        return self.spec is not None and "map" in self.spec

    @property
    def child(self) -> Definition | None:
        """The workflow a child node submits a run of; None for any other node."""
        return self.kind.workflow if isinstance(self.kind, ChildStep) else None

    @property
    def queue(self) -> str:
        """The queue its attempts run on (a wait node's is never claimed)."""
        return self.kind.queue if self.kind is not None else WAIT_QUEUE

    @property
    def max_attempts(self) -> int:
        """Its attempt budget: its step's, a child node's own, 1 for a wait node."""
        if self.spec is not None and "child" in self.spec:
            return int(self.spec["child"]["max_attempts"])
        return self.kind.max_attempts if self.kind is not None else 1


@dataclass(frozen=True, slots=True)
class Branch:
    """A dependency on ``node`` taken only when its output equals ``value`` (``node.when``)."""

    node: Node[Any]
    value: Any


def dependencies(
    workflow: str, nodes: Mapping[str, Node[Any]], after: Sequence[Node[Any] | Branch | str]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The names of the dependencies in ``after`` (nodes of ``workflow`` so far), and the
    branch taken from each that is given as ``node.when(value)`` (the value as JSON)."""
    if isinstance(after, str | Node | Branch):
        raise InvalidInputError("after= takes a list of nodes, not one node: after=[node]")
    names: list[str] = []
    conds: dict[str, str] = {}
    for dep in after:
        branch = dep if isinstance(dep, Branch) else None
        node = branch.node if branch is not None else dep
        dep_name = node.name if isinstance(node, Node) else node
        if isinstance(node, Node) and nodes.get(node.name) is not node:
            raise UnknownNodeError(
                f"node {node.name!r} in after= is not a node of workflow {workflow!r}: give "
                "a node that this workflow's node(), map(), wait() or child() returned",
                node.name,
            )
        if not isinstance(dep_name, str) or dep_name not in nodes:
            raise UnknownNodeError(
                f"workflow {workflow!r} has no node {dep_name!r} (define it before use)",
                str(dep_name),
            )
        if dep_name in names:
            raise InvalidInputError(f"node {dep_name!r} is listed twice in after=")
        names.append(dep_name)
        if branch is not None:
            conds[dep_name] = codec.encode(
                branch.value,
                nodes[dep_name].branch_type,
                what=f"the branch value of node {dep_name!r}",
                limit=codec.DEFAULT_PAYLOAD_LIMIT,
            )
    return tuple(names), conds


def check_new(workflow: str, nodes: Mapping[str, Node[Any]], node: Node[Any]) -> None:
    """Refuse ``node`` as a new node of ``workflow``: a bad or taken name, or one that is
    the name of an item of a map node."""
    validate_name(node.name, what="a node name")
    if node.name in nodes:
        raise InvalidInputError(f"workflow {workflow!r} already has a node {node.name!r}")
    for other in (node, *nodes.values()):
        if other.is_map:
            clash = [n for n in (node.name, *nodes) if _is_item_name(n, other.name)]
            if clash:
                raise InvalidInputError(
                    f"node name {clash[0]!r} of workflow {workflow!r} is the name of an "
                    f"item of map node {other.name!r}: rename one of them"
                )


def check_input(what: str, wanted: Any, given: Any, input_fn: object) -> None:
    """Refuse a node whose input, without ``input_fn``, would be a workflow input of type
    ``given`` that ``what`` (a step, a child workflow) taking ``wanted`` does not accept."""
    if input_fn is None and not accepts(wanted, given):
        raise InvalidInputError(
            f"{what} takes {codec.type_name(wanted)}, not the workflow input "
            f"{codec.type_name(given)}: pass input=fn(workflow_input, outputs) to build it"
        )
    if input_fn is not None and not callable(input_fn):
        raise InvalidInputError("input= must be a function (workflow_input, outputs)")


def join_spec(join: object, deps: Sequence[str]) -> dict[str, Any] | None:
    """A node's spec for its join: None for "all", the default."""
    if join == "all":
        return None
    if join == "any":
        return {"join": "any", "parents": len(deps)}
    raise InvalidInputError(f'join= must be "all" or "any", not {join!r}')


def accepts(wanted: Any, given: Any) -> bool:
    """Whether a value of type ``given`` is one of type ``wanted``, as far as a definition
    can tell (the worker's decode checks the rest)."""
    wanted, given = bare(wanted), bare(given)
    if wanted is Any or wanted is object or wanted == given:
        return True
    return isinstance(wanted, type) and isinstance(given, type) and issubclass(given, wanted)


def _is_item_name(name: str, map_node: str) -> bool:
    """Whether ``name`` is the name of an item node of map node ``map_node`` (``m[3]``)."""
    rest = name.removeprefix(map_node)
    return rest != name and rest.startswith("[") and rest.endswith("]") and rest[1:-1].isdigit()


def bare(tp: Any) -> Any:
    """``tp`` without its ``Annotated`` constraints, which the worker checks on decode."""
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


class ChildStep(Step[Any, Any]):
    """The step a child node's attempt runs. Its handler only hands the child's input on,
    as its output: the worker's completer submits the child run in the transaction that
    completes the attempt, in a batch with others, so the run exists if and only if the
    attempt completed. The node then waits, holding no worker slot, until the child ends.

    One per child workflow (``ChildStep.of``), named after it; its queue is that of the child
    workflow's first step, which a worker serving the child listens on.
    """

    PREFIX = "cyclone.child:"

    def __init__(self, workflow: Definition) -> None:
        steps = workflow.steps()
        if not steps:
            raise InvalidInputError(
                f"workflow {workflow.name!r} has no step nodes yet: define its nodes before "
                "using it as a child"
            )
        name = self.PREFIX + workflow.name
        Kind.__init__(self, name, workflow.input_type, workflow.input_type)
        self.queue = steps[0].queue
        self.handler = self._input
        self.is_sync = False
        self.timeout = None
        self.retention = None  # it makes no runs of its own name
        self.workflow = workflow

    @classmethod
    def of(cls, workflow: Definition) -> ChildStep:
        """The child step of ``workflow``: the same object every time."""
        if (found := _CHILD_STEPS.get(workflow)) is None:
            found = _CHILD_STEPS[workflow] = cls(workflow)
        return found

    async def _input(self, ctx: HandlerContext[Any], input: Any) -> Any:
        return input


# Each workflow's child step, made once: a worker refuses two different steps of one name.
_CHILD_STEPS: weakref.WeakKeyDictionary[Definition, ChildStep] = weakref.WeakKeyDictionary()


def child_node(
    where: tuple[str, Mapping[str, Node[Any]], Any],
    workflow: Definition,
    name: str | None,
    after: Sequence[Node[Any] | Branch | str],
    input_fn: Callable[[Any, Mapping[str, Any]], Any] | None,
    join: Join,
    max_attempts: int,
) -> Node[Any]:
    """The child node submitting a run of ``workflow``, checked. ``where`` is the parent
    workflow's name, its nodes so far and its input type."""
    parent, nodes, input_type = where
    workflow = child_workflow(workflow, parent, "wf.child(...) takes")
    name = name or workflow.name
    check_input(f"child workflow {workflow.name!r}", workflow.input_type, input_type, input_fn)
    budget = validate_int(max_attempts, what="max_attempts", low=1)
    deps, conds = dependencies(parent, nodes, after)
    spec: dict[str, Any] = dict(join_spec(join, deps) or {})
    spec["child"] = {"workflow": workflow.name, "max_attempts": budget}
    output_type = getattr(workflow, "output_type", type(None))
    step = ChildStep.of(workflow)
    return Node(name, step, deps, input_fn, output_type=output_type, spec=spec, conds=conds)


def child_workflow(workflow: object, parent: str, takes: str) -> Definition:
    """``workflow`` as the workflow of a child or map node of ``parent``, checked."""
    if not hasattr(workflow, "plan") or not hasattr(workflow, "input_type"):
        raise InvalidInputError(
            f"{takes} a workflow from cyclone.define(...) or cyclone.define_result(...), "
            f"not {workflow!r}"
        )
    if typing.cast(Definition, workflow).name == parent:
        raise InvalidInputError(f"workflow {parent!r} cannot be a child of itself")
    return typing.cast(Definition, workflow)
