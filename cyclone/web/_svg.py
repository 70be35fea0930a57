"""Geometry for the dashboard's inline SVG (pure): a run's DAG in layers, a throughput chart.

The templates draw what these compute; every label stays text for Jinja2 to escape.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from cyclone._model.handles import NodeInfo, items_done
from cyclone._model.stats import Throughput

NODE_W, NODE_H = 150, 34
LABEL_CHARS = 19  # what a box's width holds
GAP_X, GAP_Y = 60, 18
MARGIN = 10


@dataclass(frozen=True, slots=True)
class Box:
    """One node drawn: its label, state (a CSS class) and top-left corner; for a map node,
    how many of its items are done (completed or failed) of how many; for a child node, its
    child run."""

    name: str
    state: str
    x: int
    y: int
    items: tuple[int, int] | None = None
    child_run: uuid.UUID | None = None  # a child node's: the box links to that run

    @property
    def label(self) -> str:
        """What the box says: the node's name (cut to fit), and a map node's items done of
        all."""
        count = "" if self.items is None else f" {self.items[0]}/{self.items[1]}"
        room = LABEL_CHARS - len(count)
        name = self.name if len(self.name) <= room else self.name[: room - 1] + "…"
        return name + count


@dataclass(frozen=True, slots=True)
class Dag:
    """A DAG laid out left to right: boxes, edge paths (SVG ``d``) and the canvas size."""

    boxes: list[Box]
    edges: list[str]
    width: int
    height: int
    box_w: int = NODE_W
    box_h: int = NODE_H


def layers(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[list[str]]:
    """Nodes by their longest path from a root; within a layer, ordered by the mean position
    of their parents (one barycentre pass keeps crossings few), then by name."""
    parents: dict[str, list[str]] = {n: [] for n in names}
    for parent, child in edges:
        if parent in parents and child in parents:
            parents[child].append(parent)
    depth: dict[str, int] = {}

    def depth_of(node: str, seen: frozenset[str]) -> int:
        if node not in depth:
            if node in seen:  # not a DAG: draw it anyway rather than recurse forever
                return 0
            ps = parents[node]
            depth[node] = 1 + max((depth_of(p, seen | {node}) for p in ps), default=-1)
        return depth[node]

    for name in names:
        depth_of(name, frozenset())
    grouped: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for name in sorted(names):
        grouped[depth[name]].append(name)
    position: dict[str, float] = {}
    for layer in grouped:
        if position:
            layer.sort(
                key=lambda n: (
                    sum(position[p] for p in parents[n]) / max(len(parents[n]), 1),
                    n,
                )
            )
        for i, name in enumerate(layer):
            position[name] = i
    return grouped


def dag(nodes: Sequence[NodeInfo], edges: Sequence[tuple[str, str]]) -> Dag:
    """Lay out a run's nodes (left to right by layer) and route its edges. A map node's
    items are drawn as one box, the map node's, with the count of those done."""
    states = {n.name: n.state for n in nodes if n.map_of is None}
    children = {n.name: n.child_run for n in nodes if n.child_run is not None}
    items = items_done(nodes)
    grouped = layers(list(states), edges)
    tallest = max((len(layer) for layer in grouped), default=0)
    height = 2 * MARGIN + tallest * NODE_H + max(tallest - 1, 0) * GAP_Y
    at: dict[str, tuple[int, int]] = {}
    boxes = []
    for col, layer in enumerate(grouped):
        used = len(layer) * NODE_H + (len(layer) - 1) * GAP_Y
        top = (height - used) // 2
        for row, name in enumerate(layer):
            x, y = MARGIN + col * (NODE_W + GAP_X), top + row * (NODE_H + GAP_Y)
            at[name] = (x, y)
            counts, kid_run = items.get(name), children.get(name)
            boxes.append(
                Box(name=name, state=states[name], x=x, y=y, items=counts, child_run=kid_run)
            )
    paths = []
    for parent, child in edges:
        if parent not in at or child not in at:
            continue
        (px, py), (cx, cy) = at[parent], at[child]
        x1, y1, x2, y2 = px + NODE_W, py + NODE_H // 2, cx, cy + NODE_H // 2
        mid = (x1 + x2) // 2
        paths.append(f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2 - 6},{y2}")
    width = 2 * MARGIN + len(grouped) * NODE_W + max(len(grouped) - 1, 0) * GAP_X
    return Dag(boxes=boxes, edges=paths, width=width, height=height)


@dataclass(frozen=True, slots=True)
class Bar:
    """One minute of one queue: bar heights in pixels, and the counts for its tooltip."""

    x: int
    completed_h: int
    failed_h: int
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """One queue's completions and failures per minute over the window."""

    queue: str
    bars: list[Bar]
    peak: int
    completed: int
    failed: int
    width: int
    height: int


CHART_H, BAR_W = 40, 4


def charts(points: Sequence[Throughput], *, minutes: int, now: dt.datetime) -> list[Chart]:
    """A chart per queue, one bar per minute (oldest on the left, the current minute last)."""
    end = now.replace(second=0, microsecond=0)
    start = end - dt.timedelta(minutes=minutes - 1)
    by_queue: dict[str, dict[dt.datetime, Throughput]] = {}
    for point in points:
        by_queue.setdefault(point.queue, {})[point.minute] = point
    out = []
    for queue, minutes_seen in sorted(by_queue.items()):
        peak = max((p.completed + p.failed for p in minutes_seen.values()), default=0)
        bars = []
        for i in range(minutes):
            minute = start + dt.timedelta(minutes=i)
            seen = minutes_seen.get(minute)
            done, failed = (seen.completed, seen.failed) if seen else (0, 0)
            scale = CHART_H / peak if peak else 0.0
            bars.append(
                Bar(
                    x=i * BAR_W,
                    completed_h=round(done * scale),
                    failed_h=round(failed * scale),
                    label=f"{minute:%H:%M} UTC: {done} completed, {failed} failed",
                )
            )
        out.append(
            Chart(
                queue=queue,
                bars=bars,
                peak=peak,
                completed=sum(p.completed for p in minutes_seen.values()),
                failed=sum(p.failed for p in minutes_seen.values()),
                width=minutes * BAR_W,
                height=CHART_H,
            )
        )
    return out
