"""The plan of a fork (pure): which nodes of an ended run a new run copies, and which it runs
again, as ``run_fork`` takes them.

A fork re-runs its node and everything after it, and every node before it that has no output
to copy (it failed, was cancelled or never ran: it runs again, and so does what comes after
it). Every other node is copied with its output: it completed, or was skipped. The nodes to
copy are therefore closed upwards: a copied node's parents are all copied, so a copied
node's state still agrees with theirs.

The graph comes from the workflow's definition in this process, which runs the new nodes
on the current code; a run whose stored graph differs (a definition changed since it was
submitted) cannot be forked, as its outputs would feed nodes they were not made for.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone._model.errors import InvalidStateError, UnknownNodeError
from cyclone._model.plans import Layout

COPIED_STATES = frozenset({"completed", "skipped"})
"""The states of a node whose fork copies it (when it is not re-run)."""


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a fork writes: the graph of its workflow, each node copied or re-run, and the
    input (``encoded``; None: the source run's)."""

    source: uuid.UUID
    node: str
    name: str
    encoded: str | None
    key: str | None
    result_node: str | None
    layout: Layout
    copied: list[bool]  # per node of the layout: copied from the source
    deps: list[int]  # per node: its parents that are re-run (0 for a copied node)

    def arguments(self) -> dict[str, Any]:
        """The parameters of ``run_fork`` after the ids and the input."""
        names, kinds, queues, attempts, _, timeouts = self.layout.nodes
        specs, conds = self.layout.shape or ([None] * len(names), [None] * len(self.edges[0]))
        return {
            "name": self.name,
            "result_node": self.result_node,
            "key": self.key,
            "fork_node": self.node,
            "node_names": names,
            "node_kinds": kinds,
            "node_queues": queues,
            "node_max_attempts": attempts,
            "node_deps": self.deps,
            "node_wait_timeouts": timeouts,
            "node_specs": specs,
            "node_copied": self.copied,
            "edge_parents": self.edges[0],
            "edge_children": self.edges[1],
            "edge_conds": conds,
        }

    @property
    def edges(self) -> tuple[list[str], list[str]]:
        """The graph's edges: parents, children."""
        return self.layout.edges

    @property
    def rerun(self) -> list[str]:
        """The nodes the fork runs again, in definition order."""
        names: list[str] = self.layout.nodes[0]
        return [n for n, copied in zip(names, self.copied, strict=True) if not copied]


def check_graph(
    name: str,
    run_id: uuid.UUID,
    layout: Layout,
    stored_nodes: Sequence[str],
    stored_edges: Sequence[tuple[str, str, str | None]],
) -> None:
    """Raise :class:`InvalidStateError` unless the run's stored nodes (not items) and edges
    (with their conditions, JSON text) are the definition's."""
    names: list[str] = layout.nodes[0]
    conds = layout.shape[1] if layout.shape else [None] * len(layout.edges[0])
    defined = {(p, c, _canonical(v)) for p, c, v in zip(*layout.edges, conds, strict=True)}
    stored = {(p, c, _canonical(v)) for p, c, v in stored_edges}
    if set(names) == set(stored_nodes) and defined == stored:
        return
    added = sorted(set(names) - set(stored_nodes))
    removed = sorted(set(stored_nodes) - set(names))
    diff = ", ".join(
        part
        for part in (
            f"nodes defined now but not in the run: {added}" if added else "",
            f"nodes of the run no longer defined: {removed}" if removed else "",
            "" if added or removed else "its edges differ",
        )
        if part
    )
    raise InvalidStateError(
        f"run {run_id} has a different graph from workflow {name!r} as this process defines "
        f"it ({diff}): a fork runs the current definition, so it can only fork runs of the "
        f"same graph; submit a new run instead"
    )


def _canonical(cond: str | None) -> str | None:
    """An edge's condition (JSON text) in one spelling, whatever its key order or spaces
    (jsonb keeps neither)."""
    if cond is None:
        return None
    return json.dumps(json.loads(cond), sort_keys=True, separators=(",", ":"))


def plan_copies(
    layout: Layout, run_id: uuid.UUID, node: str, states: Mapping[str, str]
) -> tuple[list[bool], list[int]]:
    """Which nodes of ``layout`` a fork of run ``run_id`` from ``node`` copies (their
    ``states`` in the run), and each re-run node's re-run parents."""
    names: list[str] = layout.nodes[0]
    if node not in names:
        items = " (a map node's item cannot be forked from: fork from its map node)"
        raise UnknownNodeError(
            f"workflow run {run_id} has no node {node!r}{items if '[' in node else ''}; "
            f"its nodes are {sorted(names)}",
            node,
        )
    children: dict[str, list[str]] = {n: [] for n in names}
    parents: dict[str, list[str]] = {n: [] for n in names}
    for parent, child in zip(*layout.edges, strict=True):
        children[parent].append(child)
        parents[child].append(parent)
    rerun: set[str] = set()
    todo = [node, *(n for n in names if states.get(n) not in COPIED_STATES)]
    while todo:
        current = todo.pop()
        if current not in rerun:
            rerun.add(current)
            todo.extend(children[current])
    return (
        [n not in rerun for n in names],
        [sum(p in rerun for p in parents[n]) if n in rerun else 0 for n in names],
    )
