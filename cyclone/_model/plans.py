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
class SubmitPlan:
    """What a submit writes: the run, its nodes and edges (as ``workflow_insert`` columns)."""

    name: str
    input: Any
    encoded: str
    key: str | None
    result_node: str | None
    options: Options
    nodes: tuple[list[Any], ...]  # names, kinds, queues, max attempts, deps, wait timeouts
    edges: tuple[list[str], list[str]]  # parents, children
    queues: list[str]  # of the root steps: what to wake once the run commits
    # Each node's spec and each edge's condition (JSON text or None), for a workflow with map
    # nodes, joins or branches; None for one without.
    shape: tuple[list[str | None], list[str | None]] | None = None
    root_maps: tuple[str, ...] = ()  # map nodes to expand in the insert's transaction
    parent: tuple[uuid.UUID, str] | None = None  # the run and child node submitting this one

    @classmethod
    def of(
        cls,
        name: str,
        nodes: Sequence[Node[Any]],
        input: Any,
        encoded: str,
        key: str | None,
        result_node: str | None,
        options: Options,
    ) -> SubmitPlan:
        """The plan of a run of ``nodes`` (checked, in definition order)."""
        edges = [(p, n.name) for n in nodes for p in n.after]
        shape = None
        if any(n.spec is not None or n.conds for n in nodes):
            conds = {n.name: n.conds for n in nodes}
            shape = (
                [None if n.spec is None else codec.encode_plain(n.spec) for n in nodes],
                [conds[c].get(p) for p, c in edges],
            )
        return cls(
            name=name,
            input=input,
            encoded=encoded,
            key=key,
            result_node=result_node,
            options=options,
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
        )

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
