"""The benchmark's output: Markdown tables, aligned so that they read well in a terminal too.

A figure measured over several rounds shows its best round (highest rate, lowest latency),
with the range over the rounds in brackets; a ratio is of the two best rounds, with the range
of the per-round ratios in brackets (each round's two sides ran back to back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.floor import Figure

Results = dict[str, list[Figure]]  # figure name -> one Figure per round


@dataclass(frozen=True)
class Row:
    """One line of a comparison: Cyclone's figure against another's, and the target ratio."""

    label: str
    mine: str
    other: str
    target: float | None = None  # ratio mine / other; a floor when higher is better


# Cyclone against the raw-SQL floors (and the stale drain against the analyzed one).
FLOORS = [
    Row("enqueue_many, jobs/s", "enqueue_many", "insert_unnest", 0.75),
    Row("the same, floor into Cyclone's two tables", "enqueue_many", "insert_runs_tasks"),
    Row("enqueue, calls/s (no worker)", "enqueue", "insert_single", 0.75),
    Row("enqueue + embedded worker, calls/s", "enqueue+worker", "insert_notify", 0.85),
    Row("the same, floor beside a raw consumer", "enqueue+worker", "insert_notify_consumed"),
    Row("drain c16, embedded worker, jobs/s", "drain c16", "drain_delete", 0.5),
    Row("drain c200, embedded worker, jobs/s", "drain c200", "drain_delete", 0.6),
    Row("drain c16, floor on Cyclone's two tables", "drain c16", "drain_runs_tasks"),
    Row("drain c16, plain def handlers in threads", "drain c16 sync", "drain_delete"),
    Row("the same, against async handlers", "drain c16 sync", "drain c16"),
    Row("drain c200, floor on Cyclone's two tables", "drain c200", "drain_runs_tasks"),
    Row("drain c200, worker process, jobs/s", "drain", "drain_delete", 0.25),
    Row("batch drain c200 (max_size 100), embedded", "batch drain c200", "drain_delete"),
    Row("the same, beside the plain drain c200", "batch drain c200", "drain c200", 1.5),
    Row("batch drain c200, a row per job written", "batch write drain c200", "write drain c200"),
    Row("drain c16, 1M history, analyzed", "drain c16 analyzed", "drain_delete"),
    Row("drain c16, 1M history, stale stats", "drain c16 stale", "drain c16 analyzed", 0.9),
    Row("wake p50, ms (20k history)", "wake p50", "wake_p50", 1.3),
    Row("wake p99, ms (20k history)", "wake p99", "wake_p99", 2.0),
]
OTHERS = [
    ("drain c16, jobs/s", "drain c16", 4.0),
    ("drain c200 (theirs c16), jobs/s", "drain c200", 4.0),
    ("enqueue, calls/s", "enqueue", 1.5),
    ("enqueue_many, jobs/s", "enqueue_many", None),
]


def _lower_is_better(f: Figure) -> bool:
    return f.unit == "ms"


def best(figures: Sequence[Figure]) -> float:
    """The best round's value."""
    values = [f.value for f in figures]
    return min(values) if _lower_is_better(figures[0]) else max(values)


def _number(v: float) -> str:
    return f"{v:,.2f}" if v < 10 else f"{v:,.0f}"


def value(figures: Sequence[Figure] | None) -> str:
    """The best round's value, with the range over rounds."""
    if not figures:
        return "-"
    text = _number(best(figures))
    if len(figures) > 1:
        values = [f.value for f in figures]
        text += f" ({_number(min(values))}-{_number(max(values))})"
    return text


def ratio_of(mine: Sequence[Figure] | None, other: Sequence[Figure] | None) -> tuple[str, float]:
    """``mine`` over ``other`` by their best rounds, with the range of per-round ratios."""
    if not mine or not other:
        return "-", float("nan")
    ratio = best(mine) / best(other)
    text = f"{ratio:.2f}"
    if len(mine) > 1 and len(mine) == len(other):
        per_round = [a.value / b.value for a, b in zip(mine, other, strict=True)]
        text += f" ({min(per_round):.2f}-{max(per_round):.2f})"
    return text, ratio


def _verdict(ratio: float, target: float | None, lower: bool) -> str:
    if target is None:
        return ""
    if ratio != ratio:  # nan: a side is missing
        return f"{'<=' if lower else '>='} {target:g}"
    ok = ratio <= target if lower else ratio >= target
    return f"{'<=' if lower else '>='} {target:g} {'ok' if ok else 'MISSED'}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table padded to aligned columns; the first column left, the rest right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "| " + " | ".join("-" * (w - 1) + (":" if i else "-") for i, w in enumerate(widths)) + " |"
    )
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def floors(results: Results) -> str:
    """Cyclone beside each raw floor."""
    rows = []
    for row in FLOORS:
        mine, other = results.get(row.mine), results.get(row.other)
        if not mine:
            continue
        text, ratio = ratio_of(mine, other)
        lower = _lower_is_better(mine[0])
        rows.append(
            [
                row.label,
                value(mine),
                row.other,
                value(other),
                text,
                _verdict(ratio, row.target, lower),
            ]
        )
    return table(["figure", "Cyclone", "against", "value", "ratio", "target"], rows)


def others(results: Results, names: Sequence[str]) -> str:
    """Cyclone beside PgQueuer and Procrastinate."""
    rows = []
    for label, mine_name, target in OTHERS:
        mine = results.get(mine_name)
        theirs = "drain c16" if mine_name == "drain c200" else mine_name
        cells = [label, value(mine)]
        for name in names:
            other = results.get(f"{name} {theirs}")
            text, ratio = ratio_of(mine, other)
            cells += [value(other), text]
            if name == "pgqueuer":
                cells.append(_verdict(ratio, target, False))
        rows.append(cells)
    header = ["figure", "Cyclone"]
    for name in names:
        header += [name, f"Cyclone/{name}"] + (["target"] if name == "pgqueuer" else [])
    return table(header, rows)


def extras(results: Results) -> list[str]:
    """Figures without a counterpart: workflows, submit, floor-only."""
    lines = []
    for name in (
        "chain3 runs",
        "chain3 trips",
        "fanout runs",
        "fanout trips",
        "map nodes",
        "child nodes",
        "map's job drain",
    ):
        if f := results.get(name):
            lines.append(f"- {name}: {value(f)} {f[0].unit} ({f[0].detail})")
    if plain := results.get("submit"):
        for name in ("submit", "submit_once new", "submit_once repeat"):
            f = results[name]
            lines.append(
                f"- {name}: {value(f)} {f[0].unit}, ratio to submit {best(f) / best(plain):.2f}"
            )
    for name in ("insert_copy", "drain_update"):
        if f := results.get(name):
            lines.append(f"- floor {name}: {value(f)} {f[0].unit} ({f[0].detail})")
    # What Cyclone's storage costs by itself: its two tables written raw, against one table.
    for name, one in (("insert_runs_tasks", "insert_unnest"), ("drain_runs_tasks", "drain_delete")):
        if (f := results.get(name)) and (other := results.get(one)):
            text, _ = ratio_of(f, other)
            lines.append(f"- floor {name}: {value(f)} {f[0].unit}, {text} of {one} ({f[0].detail})")
    return lines
