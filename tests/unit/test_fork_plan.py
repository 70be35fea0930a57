"""Which nodes a fork copies and which it runs again (pure): the fork node and what comes
after it run again, and so does every node without an output to copy, with what comes after
it; a run whose stored graph is not the definition's is refused."""

from __future__ import annotations

import uuid

import pytest

import cyclone
from cyclone._model.forks import check_graph, plan_copies
from cyclone._model.plans import Layout


@cyclone.step("forkplan.a")
async def a(ctx: cyclone.Context, n: int) -> int:
    return n


diamond = cyclone.define("forkplan.diamond", int)
top = diamond.node(a, name="top")
left = diamond.node(a, name="left", after=[top])
right = diamond.node(a, name="right", after=[top])
diamond.node(a, name="bottom", after=[left, right])
LAYOUT = Layout.of(diamond.nodes)
RUN = uuid.UUID(int=1)
DONE = dict.fromkeys(["top", "left", "right", "bottom"], "completed")


def reruns(node: str, states: dict[str, str]) -> tuple[list[str], dict[str, int]]:
    copied, deps = plan_copies(LAYOUT, RUN, node, states)
    names = LAYOUT.nodes[0]
    rerun = [n for n, c in zip(names, copied, strict=True) if not c]
    return rerun, {n: d for n, d, c in zip(names, deps, copied, strict=True) if not c}


def test_the_fork_node_and_what_comes_after_it_run_again() -> None:
    assert reruns("left", DONE) == (["left", "bottom"], {"left": 0, "bottom": 1})
    assert reruns("top", DONE) == (
        ["top", "left", "right", "bottom"],
        {"top": 0, "left": 1, "right": 1, "bottom": 2},
    )


def test_a_node_without_an_output_to_copy_runs_again() -> None:
    # left failed and right was held back: a fork from left runs right too.
    states = {**DONE, "left": "failed", "right": "pending", "bottom": "pending"}
    assert reruns("left", states) == (
        ["left", "right", "bottom"],
        {"left": 0, "right": 0, "bottom": 2},
    )
    assert reruns("bottom", {**DONE, "right": "skipped"})[0] == ["bottom"]  # skipped: copied


def test_an_unknown_node_or_an_item_is_refused() -> None:
    with pytest.raises(cyclone.UnknownNodeError, match="no node 'nope'"):
        plan_copies(LAYOUT, RUN, "nope", DONE)
    with pytest.raises(cyclone.UnknownNodeError, match="fork from its map node"):
        plan_copies(LAYOUT, RUN, "left[0]", DONE)


def test_a_stored_graph_must_be_the_definitions() -> None:
    nodes = ["top", "left", "right", "bottom"]
    edges = [(p, c, None) for p, c in zip(*LAYOUT.edges, strict=True)]
    check_graph("forkplan.diamond", RUN, LAYOUT, nodes, edges)
    with pytest.raises(cyclone.InvalidStateError, match=r"no longer defined: \['gone'\]"):
        check_graph("forkplan.diamond", RUN, LAYOUT, [*nodes, "gone"], edges)
    with pytest.raises(cyclone.InvalidStateError, match="its edges differ"):
        check_graph("forkplan.diamond", RUN, LAYOUT, nodes, [*edges[:-1], ("top", "bottom", None)])
    with pytest.raises(cyclone.InvalidStateError, match="its edges differ"):
        check_graph("forkplan.diamond", RUN, LAYOUT, nodes, [*edges[:-1], (*edges[-1][:2], "1")])
