"""The plan of rows a workflow submit writes (pure): the run, its nodes and its edges, as
the insert statements take them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cyclone._model import codec
from cyclone._model.nodes import Node
from cyclone._model.options import Options


@dataclass(frozen=True, slots=True)
class Layout:
    """The rows of a workflow's graph as ``workflow_insert`` takes them, the same for every
    run: made once per definition (``Layout.of``)."""

    nodes: tuple[list[Any], ...]  # names, kinds, queues, max attempts, deps, wait timeouts
    edges: tuple[list[str], list[str]]  # parents, children
    queues: list[str]  # of the root steps: what to wake once the run commits
    # Each node's spec and each edge's condition (JSON text or None), for a workflow with map
    # nodes, joins or branches; None for one without.
    shape: tuple[list[str | None], list[str | None]] | None
    root_maps: tuple[str, ...]  # map nodes to expand in the insert's transaction
    compares_outputs: bool  # a branch compares a node's output (an event's name is plain)

    @classmethod
    def of(cls, nodes: Sequence[Node[Any]]) -> Layout:
        """The layout of ``nodes`` (checked, in definition order)."""
        edges = [(p, n.name) for n in nodes for p in n.after]
        by_name = {n.name: n for n in nodes}
        shape = None
        if any(n.spec is not None or n.conds for n in nodes):
            conds = {n.name: n.conds for n in nodes}
            shape = (
                [None if n.spec is None else codec.encode_plain(n.spec) for n in nodes],
                [conds[c].get(p) for p, c in edges],
            )
        return cls(
            nodes=(
                [n.name for n in nodes],
                [n.kind.name if n.kind else None for n in nodes],
                [n.queue for n in nodes],
                [n.max_attempts for n in nodes],
                [len(n.after) for n in nodes],
                [n.timeout for n in nodes],
            ),
            edges=([p for p, _ in edges], [c for _, c in edges]),
            queues=sorted({n.kind.queue for n in nodes if n.kind and not n.after and not n.is_map}),
            shape=shape,
            root_maps=tuple(n.name for n in nodes if n.is_map and not n.after),
            compares_outputs=any(
                not by_name[parent].branches_on_event for n in nodes for parent in n.conds
            ),
        )


@dataclass(frozen=True, slots=True)
class SubmitPlan:
    """What a submit writes: the run, its nodes and edges (as ``workflow_insert`` columns)."""

    name: str
    input: Any
    encoded: str
    key: str | None
    result_node: str | None
    options: Options
    nodes: tuple[list[Any], ...]  # as in Layout
    edges: tuple[list[str], list[str]]
    queues: list[str]
    shape: tuple[list[str | None], list[str | None]] | None = None
    root_maps: tuple[str, ...] = ()
    parent: tuple[uuid.UUID, str] | None = None  # the run and child node submitting this one
    compares_outputs: bool = False  # as in Layout

    @classmethod
    def of(
        cls,
        name: str,
        layout: Layout,
        input: Any,
        encoded: str,
        key: str | None,
        result_node: str | None,
        options: Options,
        parent: tuple[uuid.UUID, str] | None = None,
    ) -> SubmitPlan:
        """The plan of a run of the workflow laid out as ``layout``."""
        return cls(
            name=name,
            input=input,
            encoded=encoded,
            key=key,
            result_node=result_node,
            options=options,
            nodes=layout.nodes,
            edges=layout.edges,
            queues=layout.queues,
            shape=layout.shape,
            root_maps=layout.root_maps,
            parent=parent,
            compares_outputs=layout.compares_outputs,
        )

    @property
    def grows_root_maps(self) -> bool:
        """Whether the insert itself grows the root map nodes' items: there are some, and
        the input is a non-empty list (the submit checked it against their bounds)."""
        return bool(self.root_maps) and isinstance(self.input, list | tuple) and bool(self.input)

    @property
    def root_map_queues(self) -> set[str]:
        """The queues of the root map nodes' items."""
        names, _, queues = self.nodes[:3]
        return {queue for name, queue in zip(names, queues, strict=True) if name in self.root_maps}

    @property
    def node_count(self) -> int:
        """How many nodes the run has."""
        return len(self.nodes[0])

    def arguments(self, trace: str | None) -> tuple[Any, ...]:
        """The parameters of ``workflow_insert`` after the run id (``trace``: the trace
        context to store, taken inside the submit's span)."""
        opts = self.options
        priority = 0 if opts.priority is None else opts.priority
        return (
            self.name,
            self.encoded,
            self.result_node,
            self.key,
            self.node_count,
            opts.run_deadline,
            priority,
            opts.process_at,
            *self.nodes,
            *self.edges,
            trace,
            opts.group,
        )
