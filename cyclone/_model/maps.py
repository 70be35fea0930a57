"""Map nodes (pure): a step, a kind or a result workflow run once per item of a list, and
the checks of their settings, of what they map over and of an input list's length.

A map node is stored as one node with a spec (``{"map": {...}}``); its item nodes, named
``map[0]``, ``map[1]``..., are written when the run reaches it: an item runs the map's step,
or (over a workflow) a child run of it.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone._model import codec
from cyclone._model.errors import InvalidInputError, UnknownNodeError
from cyclone._model.nodes import (
    Branch,
    ChildStep,
    Definition,
    Join,
    Node,
    accepts,
    bare,
    child_workflow,
    dependencies,
    join_spec,
)
from cyclone._model.settled import Settled
from cyclone._model.steps import DEFAULT_MAX_ATTEMPTS, Kind


@dataclass(frozen=True, slots=True)
class MapSettings:
    """A map node's settings as ``wf.map`` takes them."""

    max_parallel: int | None
    settle: bool
    max_items: int


def map_node(
    where: tuple[str, Mapping[str, Node[Any]], Any],
    step: Kind[Any, Any] | Definition,
    over: Node[Any] | None,
    name: str | None,
    after: Sequence[Node[Any] | Branch | str],
    join: Join,
    settings: MapSettings,
) -> Node[Any]:
    """The map node running ``step`` once per item of ``over``'s output (or, without
    ``over``, of the workflow input), checked; a workflow as ``step`` makes each item a
    child run of it. ``where`` is the workflow's name, its nodes so far and its input
    type."""
    workflow, nodes, source = where
    child = None
    if not isinstance(step, Kind):
        child = child_workflow(step, workflow, "wf.map(...) takes a step, a kind or")
        if not hasattr(child, "output_type"):
            raise InvalidInputError(
                f"wf.map(...) over workflow {child.name!r} collects its runs' results, and "
                "it has none: define it with cyclone.define_result(...)"
            )
        step = ChildStep.of(child)
    name = name or (step.name if child is None else child.name)
    runs = f"step {step.name!r}" if child is None else f"workflow {child.name!r}"
    if over is None:
        what = f"the workflow input of {workflow!r}"
    elif isinstance(over, Node):
        _check_over(workflow, nodes, name, over, step.input_type)
        source, what = over.output_type, f"the output of node {over.name!r}"
    elif isinstance(over, str):
        raise InvalidInputError(
            f"map node {name!r}: over= takes the node itself (what {workflow}'s node(), map() "
            f"or child() returned), not its name {over!r}"
        )
    else:
        raise InvalidInputError(
            f"map node {name!r}: over= must be a node of workflow {workflow!r}, whose "
            f"output is the list to map over, not {codec.type_name(type(over))} {over!r}"
        )
    element = _element_type(source)
    if element is None or not accepts(step.input_type, element):
        raise InvalidInputError(
            f"map node {name!r} runs {runs} once per item of {what}, which is "
            f"{codec.type_name(source)}: it must be a list of "
            f"{codec.type_name(step.input_type)}"
        )
    max_parallel, settle, max_items = settings.max_parallel, settings.settle, settings.max_items
    if max_parallel is not None and (
        not isinstance(max_parallel, int) or isinstance(max_parallel, bool) or max_parallel < 1
    ):
        raise InvalidInputError(
            f"max_parallel= must be a positive int or None, not {max_parallel!r}"
        )
    if not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 0:
        raise InvalidInputError(f"max_items= must be an int of at least 0, not {max_items!r}")
    if not isinstance(settle, bool):
        raise InvalidInputError(f"settle= must be True or False, not {settle!r}")
    if over is not None and over not in after and over.name not in after:
        after = [*after, over]
    deps, conds = dependencies(workflow, nodes, after)
    spec: dict[str, Any] = dict(join_spec(join, deps) or {})
    spec["map"] = {
        "over": None if over is None else over.name,
        "max_parallel": max_parallel,
        "settle": settle,
        "max_items": max_items,
    }
    out = step.output_type if child is None else typing.cast(Any, child).output_type
    if child is not None:  # each item a child run, with a child node's attempt budget
        spec["child"] = {"workflow": child.name, "max_attempts": DEFAULT_MAX_ATTEMPTS}
    item_type = typing.cast(Any, Settled)[out] if settle else out
    output_type = types.GenericAlias(list, (item_type,))
    return Node(name, step, deps, None, output_type=output_type, spec=spec, conds=conds)


def _check_over(
    workflow: str, nodes: Mapping[str, Node[Any]], name: str, over: Node[Any], item: Any
) -> None:
    """Refuse as ``over=`` a node of another workflow, or a wait node (its output, the
    signal's payload, is untyped)."""
    if nodes.get(over.name) is not over:
        raise UnknownNodeError(
            f"map node {name!r}: over= is node {over.name!r}, which is not a node of workflow "
            f"{workflow!r} so far: give a node of this workflow, defined before the map",
            over.name,
        )
    if over.kind is None:
        raise InvalidInputError(
            f"map node {name!r} cannot map over wait node {over.name!r}: a signal's payload "
            f"is untyped (Any), so nothing says it is a list of {codec.type_name(item)}; add a "
            "step node after the wait node that takes the payload and returns the list, and "
            "map over that node"
        )


def check_items(workflow: str, nodes: Iterable[Node[Any]], input: object) -> None:
    """Refuse, before anything is written, an input that a map node over the workflow
    input would find too long."""
    for n in nodes:
        spec = n.spec["map"] if n.is_map and n.spec else None
        if spec is None or spec["over"] is not None:
            continue
        count = len(input) if isinstance(input, Sequence) else 0
        if count > spec["max_items"]:
            raise InvalidInputError(
                f"map node {n.name!r} of workflow {workflow!r} would run over the "
                f"{count} items of the input, over its max_items of {spec['max_items']}: "
                "raise max_items= or split the list"
            )


def _element_type(tp: Any) -> Any:
    """The element type of a list type (``Any`` for ``Any``), or None if ``tp`` is no list."""
    tp = bare(tp)
    if tp is Any or tp is object:
        return Any
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple, Sequence, collections.abc.Sequence) or tp in (list, tuple):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return None  # a fixed-length tuple's items have types of their own
        return args[0] if args else Any
    return None
