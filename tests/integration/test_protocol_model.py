"""The claim protocol checked by machine: a hypothesis rule-based state machine, against the
real database, that interleaves enqueues, claims, heartbeats, completions, retries, last
failures, cancels, the clock passing leases, maintenance passes (expired leases and lost
workers) and worker deaths across several simulated workers, with a model of what each
should do, and checks after every step:

- a task is owned by at most one attempt, the one its claim count names, and a running
  task by exactly one (the attempts the model holds for live and dead workers);
- an outcome (completion, retry, failure, heartbeat) is accepted exactly when its attempt
  still owns its task: never from a fenced one;
- every run is either pending with a task, or ended with its outcome and no task, in the
  state the model expects;
- every state change of a run or task row between two steps is one the state table
  (``cyclone._model.states.TRANSITIONS``) lists.

Hypothesis shrinks a failure to a minimal interleaving. CI runs the same 40 interleavings
of up to 80 steps every time (derandomized, about 20 s), and fails if they never reached a
fenced attempt's late outcome, an expired lease or a lost worker;
``CYCLONE_MODEL_EXAMPLES=500 pytest tests/integration/test_protocol_model.py`` runs 500 new
ones.

The workers are simulated: each is a liveness session holding its advisory lock and a
presence row naming it, and its statements are the ones a worker sends (the claim, the
heartbeat, the completer's outcomes, the maintenance pass's reclaims), sent by the rules.
A dead worker's session is closed; its attempts stay in the model, and their late outcomes
(a process whose connection was cut) are sent too, to be refused once fenced. The clock is
moved by a table every statement reads, in steps that never land near a lease's end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import uuid
from collections import Counter
from typing import Any, ClassVar

import asyncpg
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import cyclone
from cyclone._model import codec
from cyclone._model.states import TRANSITIONS
from cyclone._services import transitions
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries
from cyclone.testing.plugin import DatabaseFactory

LEASE = 1000.0  # seconds; the clock moves by PASSES, so a lease is either clearly out or not
PASSES = (400, 1000)
CLOCK = "(now() + (SELECT make_interval(secs => shift) FROM public.model_clock))"
QUEUE = "model"
# CI runs the same interleavings every time (derandomized); a count given runs new ones.
EXAMPLES = int(os.environ.get("CYCLONE_MODEL_EXAMPLES", "0")) or None

# Interleavings the run must reach, or it checked less than it says (counted in ``seen``).
LATE = "an outcome of a fenced attempt whose task another attempt owns"
EXPIRED = "a maintenance pass released a task whose lease expired"
RESCUED = "a maintenance pass released a task of a lost worker"

ALLOWED = {
    (t.table.value, source, t.target)
    for t in TRANSITIONS
    for source in (t.source or frozenset({None}))
}


@cyclone.step("model.job", queue=QUEUE)
async def job(ctx: cyclone.Context, n: int) -> int:
    return n


@dataclasses.dataclass
class Attempt:
    """An attempt a simulated worker holds: the task's claim count when it claimed it."""

    worker: str
    run_id: uuid.UUID
    id: int
    claims: int
    attempt: int
    max_attempts: int
    node: str | None = None
    lease_set: int = 0  # the clock's shift when its lease was last set


@dataclasses.dataclass
class SimWorker:
    name: str
    key: int
    session: asyncpg.Connection | None  # the liveness session; None once dead


class ProtocolModel(RuleBasedStateMachine):
    factory: DatabaseFactory  # set by the test
    seen: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.q = Queries("public", clock=CLOCK)
        self.shift = 0
        self.keys = itertools.count(1)
        self.workers: list[SimWorker] = []
        self.runs: dict[uuid.UUID, str] = {}  # the state the model expects
        self.current: dict[int, Attempt] = {}  # task id -> the attempt owning it
        self.fenced: list[Attempt] = []  # attempts that lost their task
        self.snapshot: dict[tuple[str, Any], str] = {}
        self.dsn = self.run(self.factory.create())
        self.pool: asyncpg.Pool = self.run(self.open())
        self.client = cyclone.Client(self.pool, notify=False)

    async def open(self) -> asyncpg.Pool:
        pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=4)
        await pool.execute("CREATE TABLE public.model_clock (shift float8 NOT NULL)")
        await pool.execute("INSERT INTO public.model_clock VALUES (0)")
        return pool

    def reached(self, what: str) -> None:
        event(what)
        self.seen[what] += 1

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        for w in self.workers:
            if w.session is not None:
                self.run(w.session.close())
        self.run(self.client.aclose())
        self.run(self.pool.close())
        self.run(self.factory.drop(self.dsn))
        self.loop.close()

    # -- the model's views

    def attempts(self) -> list[Attempt]:
        return [*self.current.values(), *self.fenced]

    def live(self) -> list[SimWorker]:
        return [w for w in self.workers if w.session is not None]

    def fence(self, attempt: Attempt) -> None:
        del self.current[attempt.id]
        self.fenced.append(attempt)

    # -- rules

    @initialize(n=st.integers(2, 4), max_attempts=st.integers(1, 3))
    def begin(self, n: int, max_attempts: int) -> None:
        """Jobs waiting and two workers, so that every interleaving starts with work."""
        self.enqueue(n, max_attempts)
        self.start_worker()
        self.start_worker()

    @rule(n=st.integers(1, 3), max_attempts=st.integers(1, 3))
    def enqueue(self, n: int, max_attempts: int) -> None:
        runs = self.run(job.enqueue_many(self.client, list(range(n)), max_attempts=max_attempts))
        for r in runs:
            self.runs[r.id] = "pending"

    def start_worker(self) -> SimWorker:
        name, key = f"w{len(self.workers)}", next(self.keys)
        session = self.run(asyncpg.connect(self.dsn))
        assert self.run(db.worker_liveness_hold(session, self.q, key))
        self.workers.append(SimWorker(name, key, session))
        self.present(self.workers[-1])
        return self.workers[-1]

    def present(self, w: SimWorker) -> None:
        self.run(
            self.with_conn(
                db.worker_present, w.name, "host", 1, [QUEUE], [job.name], [], 10.0**9, w.key
            )
        )

    async def with_conn(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        async with self.pool.acquire() as conn:
            return await fn(conn, self.q, *args, **kwargs)

    @rule(which=st.integers(0, 3), limit=st.integers(1, 3))
    def claim(self, which: int, limit: int) -> None:
        """A live worker claims (one started for it when there are fewer than ``which``)."""
        live = self.live()
        w = live[which] if which < len(live) else self.start_worker()
        request = db.ClaimRequest(QUEUE, [job.name], limit, LEASE, w.name, [])
        rows = self.run(self.with_conn(db.task_claim, request))
        for r in rows:
            assert r["id"] not in self.current, "a task claimed while an attempt owns it"
            assert self.runs[r["run_id"]] == "pending"
            self.current[r["id"]] = Attempt(
                w.name,
                r["run_id"],
                r["id"],
                r["claims"],
                r["attempt"],
                r["max_attempts"],
                lease_set=self.shift,
            )

    @precondition(lambda self: self.attempts())
    @rule(which=st.integers(0, 10**6), outcome=st.sampled_from(["heartbeat", "complete", "fail"]))
    def outcome(self, which: int, outcome: str) -> None:
        """An attempt's worker sends its heartbeat, completion or failure; a fenced one's too
        (a late worker, or a dead one whose process lives on)."""
        everything = self.attempts()
        a = everything[which % len(everything)]
        owner = self.current.get(a.id)
        if owner is not None and owner is not a:
            self.reached(LATE)
        getattr(self, outcome)(a, owns=owner is a)

    def heartbeat(self, a: Attempt, *, owns: bool) -> None:
        owned = self.run(self.with_conn(db.task_heartbeat, db.Fence.of([a]), LEASE))
        assert owned == ({(a.id, a.claims)} if owns else set()), "a heartbeat's fence"
        if owns:
            a.lease_set = self.shift
        for w in self.live():
            if w.name == a.worker:
                self.present(w)

    def complete(self, a: Attempt, *, owns: bool) -> None:
        done = db.Completions(db.Fence.of([a]), [codec.encode_plain(a.id)])

        async def go() -> list[Any]:
            async with self.pool.acquire() as conn, conn.transaction():
                return await db.job_complete_many(conn, self.q, done)

        accepted = bool(self.run(go()))
        assert accepted == owns, "a completion's fence"
        if accepted:
            self.runs[a.run_id] = "completed"
            del self.current[a.id]

    def fail(self, a: Attempt, *, owns: bool) -> None:
        """The handler raised: a retry with attempts left, else the run fails."""
        error = codec.encode_plain({"type": "Boom", "message": "model", "attempt": a.attempt})
        last = a.attempt >= a.max_attempts

        async def go() -> bool:
            async with self.pool.acquire() as conn, conn.transaction():
                if last:
                    owned, _ = await transitions.fail_node_or_job(
                        conn, self.q, a, error, expired_only=False
                    )
                    return owned
                rows = await db.task_retry_many(
                    conn, self.q, db.Fence.of([a]), [0.0], [error], [False]
                )
                return bool(rows)

        owned = self.run(go())
        assert owned == owns, "a failure's fence"
        if owned:
            self.fence(a)
            if last:
                self.runs[a.run_id] = "failed"

    @precondition(lambda self: self.runs)
    @rule(which=st.integers(0, 10**6))
    def cancel(self, which: int) -> None:
        run_id = list(self.runs)[which % len(self.runs)]

        async def go() -> bool:
            async with self.pool.acquire() as conn, conn.transaction():
                cancelled, _ = await transitions.cancel(conn, self.q, run_id)
                return cancelled

        cancelled = self.run(go())
        # A failed job is cancelled too (a failed sequenced job blocks its sequence till then).
        assert cancelled == (self.runs[run_id] in ("pending", "failed"))
        if cancelled:
            self.runs[run_id] = "cancelled"
            for a in [a for a in self.current.values() if a.run_id == run_id]:
                self.fence(a)

    @rule(seconds=st.sampled_from(PASSES), then_maintain=st.booleans())
    def pass_time(self, seconds: int, then_maintain: bool) -> None:
        """The clock moves on (past the leases not renewed for 1000 s); workers' maintenance
        passes see it at once, or a step later."""
        self.shift += seconds
        self.run(self.pool.execute("UPDATE public.model_clock SET shift = $1", self.shift))
        if then_maintain:
            self.maintenance()

    @precondition(lambda self: self.live())
    @rule(which=st.integers(0, 2), then_rescue=st.booleans())
    def kill_worker(self, which: int, then_rescue: bool) -> None:
        """A worker's process dies: its liveness session ends (observed gone from
        pg_locks before the next step, as its peers will see it); a peer's rescue probe
        sees it at once, or a step later."""
        w = self.live()[which % len(self.live())]
        assert w.session is not None
        self.run(w.session.close())
        w.session = None
        self.run(self.until_unlocked(w.key))
        if then_rescue:
            self.maintenance()

    async def until_unlocked(self, key: int) -> None:
        async with asyncio.timeout(30):
            while await self.pool.fetchval(  # noqa: ASYNC110 - another session's state
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND classid = 1668899693 AND objid = $1::oid AND objsubid = 2",
                key,
            ):
                await asyncio.sleep(0.01)

    @rule()
    def maintenance(self) -> None:
        """A maintenance pass: expired leases, then lost workers, each with its last attempts
        failed, as the worker's pass sends them."""
        dead = {w.name for w in self.workers if w.session is None}
        expired = {
            a.id
            for a in self.current.values()
            if self.shift - a.lease_set >= LEASE and a.worker not in dead
        }
        lost = {a.id for a in self.current.values() if a.worker in dead}
        released = self.run(self.reclaim(lost=False)) | self.run(self.reclaim(lost=True))
        assert released == expired | lost
        if expired:
            self.reached(EXPIRED)
        if lost:
            self.reached(RESCUED)
        for task in released:
            a = self.current[task]
            self.fence(a)
            if a.attempt >= a.max_attempts:
                self.runs[a.run_id] = "failed"

    async def reclaim(self, *, lost: bool) -> set[int]:
        q = self.q
        async with self.pool.acquire() as conn:
            if lost and not await db.workers_lost(conn, q):
                return set()
            rows = await (db.task_rescue if lost else db.task_reclaim)(conn, q, 100)
            taken = {r["id"] for r in rows}
            exhausted = db.task_lost_exhausted if lost else db.task_expired_exhausted
            for row in await exhausted(conn, q, 100):
                error = codec.encode_plain({"type": "Lost", "message": "model"})
                async with conn.transaction():
                    owned, _ = await transitions.fail_node_or_job(
                        conn, q, db.TaskAttempt.of(row), error, expired_only=not lost
                    )
                assert owned
                taken.add(row["id"])
        return taken

    # -- invariants

    @invariant()
    def tasks_are_owned_once(self) -> None:
        tasks = self.run(
            self.pool.fetch("SELECT id, run_id, state, claims, worker FROM public.cyclone_tasks")
        )
        for t in tasks:
            a = self.current.get(t["id"])
            if t["state"] == "running":
                assert a is not None and (a.claims, a.worker) == (t["claims"], t["worker"])
            else:
                assert a is None, f"an attempt owns available task {t['id']}"
        assert len(self.current) == sum(t["state"] == "running" for t in tasks)

    @invariant()
    def runs_are_pending_with_a_task_or_ended(self) -> None:
        rows = self.run(
            self.pool.fetch(
                "SELECT r.id, r.state, r.output IS NOT NULL AS output, r.error IS NOT NULL AS"
                " error, (SELECT count(*) FROM public.cyclone_tasks t WHERE t.run_id = r.id)"
                " AS tasks FROM public.cyclone_runs r"
            )
        )
        assert {r["id"]: r["state"] for r in rows} == self.runs
        for r in rows:
            if r["state"] == "pending":
                assert r["tasks"] == 1
            else:
                assert r["tasks"] == 0
            assert r["output"] == (r["state"] == "completed")
            if r["state"] in ("pending", "failed"):
                assert r["error"] == (r["state"] == "failed")

    @invariant()
    def every_change_is_in_the_state_table(self) -> None:
        rows = self.run(
            self.pool.fetch(
                "SELECT 'cyclone_runs' AS t, id::text AS k, state FROM public.cyclone_runs"
                " UNION ALL SELECT 'cyclone_tasks', id::text, state FROM public.cyclone_tasks"
            )
        )
        now = {(r["t"], r["k"]): r["state"] for r in rows}
        for key in now.keys() | self.snapshot.keys():
            before, after = self.snapshot.get(key), now.get(key)
            if before != after:
                assert (key[0], before, after) in ALLOWED, (key, before, after)
        self.snapshot = now


@pytest.mark.timeout(1800)  # shrinking a failure replays many interleavings
def test_the_protocol_keeps_its_invariants(cyclone_databases: DatabaseFactory) -> None:
    ProtocolModel.factory = cyclone_databases
    ProtocolModel.TestCase.settings = settings(
        max_examples=EXAMPLES or 40,
        derandomize=EXAMPLES is None,
        database=None,
        stateful_step_count=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    ProtocolModel.seen.clear()
    ProtocolModel.TestCase().runTest()
    assert ProtocolModel.seen.keys() >= {LATE, EXPIRED, RESCUED}, ProtocolModel.seen
