"""Run every benchmark on one PostgreSQL, in one run, and print Cyclone's figures as ratios to
the raw-SQL floor: ``python -m benchmarks [--dsn DSN]``.

Without ``--dsn`` (or ``CYCLONE_BENCH_DSN``) it starts a throwaway server with PostgreSQL's
durable defaults (fsync on), so the numbers mean what they would in production.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

import cyclone
from benchmarks import floor, library
from benchmarks.floor import Figure
from cyclone.testing import describe, postgres_server

ROUNDS = 2  # each paired figure is the best of this many rounds, for both sides alike

# (library figure, floor figure, target ratio, higher is better)
PAIRS = [
    ("enqueue_many", "insert_unnest", 0.50, True),
    ("enqueue", "insert_single", 0.75, True),
    ("drain", "drain_delete", 0.25, True),
    ("wake p50", "wake_p50", 2.0, False),
    ("wake p99", "wake_p99", None, False),
]


async def measure(dsn: str) -> tuple[dict[str, Figure], dict[str, Figure]]:
    """Each floor right before its Cyclone counterpart, on a settled server, so that both
    sides of a ratio see the same conditions (not an idle server for one and the churn of
    the previous benchmark for the other)."""
    async with asyncpg.create_pool(dsn, min_size=2, max_size=20) as pool:
        await cyclone.Client(pool).migrate()

        async def connect() -> asyncpg.Connection:
            conn: asyncpg.Connection = await asyncpg.connect(dsn)
            return conn

        async def settle() -> None:
            await pool.execute("VACUUM ANALYZE")
            await pool.execute("CHECKPOINT")

        raw: dict[str, Figure] = {}
        lib: dict[str, Figure] = {}
        pairs: list[tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]] = [
            (lambda: floor.insert_unnest(pool), lambda: library.enqueue_many(pool)),
            (lambda: floor.insert_single(pool), lambda: library.enqueue_single(pool)),
            (lambda: floor.drain_delete(pool), lambda: library.drain(pool, dsn)),
            (lambda: floor.wake_latency(pool, connect), lambda: library.wake_latency(pool)),
        ]
        for raw_side, lib_side in pairs:
            # Best of two rounds, each side right after the other: the first round also
            # warms caches and prepared statements, on both sides alike.
            for _ in range(ROUNDS):
                await settle()
                _keep_best(raw, _figures(await raw_side()))
                _keep_best(lib, _figures(await lib_side()))
        await settle()
        for figure in [
            await floor.insert_copy(pool),
            await floor.drain_update(pool),
            *await library.workflow_runs(pool, dsn, library.chain3, runs=300),
            *await library.workflow_runs(pool, dsn, library.fanout, runs=20),
            *await library.submit_rates(pool),
        ]:
            (raw if figure.name in {"insert_copy", "drain_update"} else lib)[figure.name] = figure
    return raw, lib


def _figures(result: Figure | tuple[Figure, ...]) -> tuple[Figure, ...]:
    return result if isinstance(result, tuple) else (result,)


def _keep_best(into: dict[str, Figure], figures: tuple[Figure, ...]) -> None:
    for f in figures:
        old = into.get(f.name)
        lower_is_better = f.unit == "ms"
        if old is None or (f.value < old.value if lower_is_better else f.value > old.value):
            into[f.name] = f


def report(raw: dict[str, Figure], lib: dict[str, Figure]) -> str:
    lines = [f"{'cyclone':<14}{'value':>12}  {'floor':<14}{'value':>12}  {'ratio':>7}  target"]
    for mine, base, target, higher in PAIRS:
        a, b = lib[mine], raw[base]
        ratio = a.value / b.value
        if target is None:
            verdict = ""
        elif higher:
            verdict = f">= {target:.2f} {'ok' if ratio >= target else 'MISSED'}"
        else:
            verdict = f"<= {target:.2f} {'ok' if ratio <= target else 'MISSED'}"
        lines.append(
            f"{mine:<14}{a.value:>12,.1f}  {base:<14}{b.value:>12,.1f}  {ratio:>7.2f}  {verdict}"
        )
    lines.append("")
    for name in ("chain3 runs", "chain3 trips", "fanout runs", "fanout trips"):
        f = lib[name]
        lines.append(f"{name:<20}{f.value:>10,.1f} {f.unit} ({f.detail})")
    plain = lib["submit"].value
    for name in ("submit", "submit_once new", "submit_once repeat"):
        f = lib[name]
        lines.append(f"{name:<20}{f.value:>10,.1f} {f.unit}  ratio to submit {f.value / plain:.2f}")
    lines.append("")
    lines.append(
        "floor only: "
        + ", ".join(
            f"{f.name} {f.value:,.1f} {f.unit}"
            for f in raw.values()
            if f.name not in {p[1] for p in PAIRS}
        )
    )
    lines.append(
        "units: " + ", ".join(f"{lib[m].name} {lib[m].unit} ({lib[m].detail})" for m, *_ in PAIRS)
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    args = parser.parse_args()
    if args.dsn:
        print(report(*asyncio.run(measure(args.dsn))))
        return
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True) as server:
        print(f"# {describe(server)}, durable settings")
        print(report(*asyncio.run(measure(server.dsn))))


if __name__ == "__main__":
    main()
