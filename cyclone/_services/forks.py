"""Forking a run: a new run of an ended workflow run's graph that copies the outputs of the
nodes before one node and runs that node and what comes after it again (``client.fork``).

A fork is one transaction. It locks the run it forks (``run_lock_many``), so a retry or a
cancel of that run waits for it and the states it copies are the run's last; it refuses a run
that is still pending, a job, and a run whose graph is not one this process defines
(``_model/forks.py`` says why); it writes the new run with its copied and pending nodes
(``run_fork``) and releases the pending nodes whose parents are all copied (``run_release``),
as a re-opened run's are, so the new run moves on as any other. A keyed fork meets a retry of
itself at the submit key (``idx_runs_submit_key``): the second call finds the first fork.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from cyclone._model import codec
from cyclone._model.errors import (
    InvalidInputError,
    InvalidStateError,
    KeyContentionError,
    RunNotFoundError,
    SubmitConflictError,
    UnknownKindError,
)
from cyclone._model.forks import ForkPlan
from cyclone._model.handles import ResultRun, Run, RunsClient
from cyclone._model.ids import uuid7
from cyclone._model.keyring import Keyring, reveal
from cyclone._model.keys import validate_key, validate_name
from cyclone._model.results import ResultWorkflow
from cyclone._model.states import RunState
from cyclone._model.submission import Submittable
from cyclone._model.workflows import defined_workflows
from cyclone._services.database import Database
from cyclone._services.graph import end_children, release
from cyclone._services.publisher import Publisher
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

KEY_TRIES = 3  # a fork's key whose run was purged between the insert and the look-up


def run_id_of(run: object, *, call: str) -> uuid.UUID:
    """The id of ``run``, a handle or a run id; :class:`InvalidInputError` for anything else."""
    if isinstance(run, Run):
        return run.id
    if isinstance(run, uuid.UUID):
        return run
    raise InvalidInputError(
        f"{call}() takes a cyclone.Run or a uuid.UUID, got {type(run).__name__}: "
        f"pass uuid.UUID(text) for a run id in text"
    )


class Forks:
    """Forks of runs on ``database``, announced by ``publisher``; a new input sealed with
    ``cipher``, and bounded by ``payload_limit``."""

    def __init__(
        self,
        database: Database,
        publisher: Publisher,
        cipher: Keyring | None,
        payload_limit: int,
    ) -> None:
        self.database = database
        self.publisher = publisher
        self.cipher = cipher
        self.payload_limit = payload_limit

    async def fork(
        self, owner: RunsClient, run: object, node: str, input: Any, key: str | None
    ) -> Run:
        """Fork ``run`` (a handle or a run id) from ``node``: a handle on the fork, given
        ``owner``, a result workflow's a :class:`ResultRun`; ``created`` is False when
        ``key``'s fork existed."""
        fork_id, workflow, created = await self._fork(run_id_of(run, call="fork"), node, input, key)
        if isinstance(workflow, ResultWorkflow):
            return ResultRun(owner, fork_id, workflow.output_type, created=created)
        return Run(owner, fork_id, created=created)

    async def _fork(
        self, run_id: uuid.UUID, node: str, input: Any, key: str | None
    ) -> tuple[uuid.UUID, Submittable[Any], bool]:
        validate_name(node, what="from_node")
        key = None if key is None else validate_key(key)
        q = self.database.queries
        async with self.database.transact() as conn:
            workflow, plan = await self._plan(conn, q, run_id, node, input, key)
            encoded = plan.encoded
            if encoded is not None and self.cipher is not None:
                encoded = self.cipher.seal(encoded)
            for _ in range(KEY_TRIES):
                fork_id = uuid7()
                made = await db.run_fork(conn, q, fork_id, run_id, encoded, plan.arguments())
                if made is not None:
                    effects = await end_children(conn, q, await release(conn, q, fork_id))
                    break
                assert plan.key is not None  # only a key makes the insert do nothing
                found = await self._keyed(conn, q, plan)
                if found is not None:
                    return found, workflow, False
            else:
                raise KeyContentionError("fork", plan.key or "", plan.name)
        self.publisher.publish(effects.payloads())
        return fork_id, workflow, True

    async def _plan(
        self, conn: db.Conn, q: Queries, run_id: uuid.UUID, node: str, input: Any, key: str | None
    ) -> tuple[Submittable[Any], ForkPlan]:
        kind = await db.run_kind(conn, q, run_id)
        if kind is None:
            raise RunNotFoundError(run_id)
        if kind["job"]:
            raise InvalidStateError(
                f"run {run_id} is a job ({kind['name']!r}): only workflow runs fork; "
                f"enqueue the job again instead"
            )
        state = (await db.run_lock_many(conn, q, [run_id])).get(run_id)
        if state is None:  # purged since it was read
            raise RunNotFoundError(run_id)
        if state == RunState.PENDING:
            raise InvalidStateError(
                f"run {run_id} is still running (pending): only an ended run forks; wait for "
                f"it to end, or cancel it first"
            )
        rows = await db.run_nodes(conn, q, run_id)
        nodes = {r["node"]: r["state"] for r in rows if r["map_of"] is None}
        edges = [(e["parent"], e["child"], e["cond"]) for e in await db.run_edges(conn, q, run_id)]
        workflow = _definition(kind["name"], run_id, list(nodes), edges)
        return workflow, workflow.plan_fork(self.payload_limit, (run_id, nodes), node, input, key)

    async def _keyed(self, conn: db.Conn, q: Queries, plan: ForkPlan) -> uuid.UUID | None:
        """The fork of ``plan.key`` made before, if it is this fork; None if it is gone."""
        assert plan.key is not None
        row = await db.workflow_find_key(conn, q, plan.name, plan.key, plan.encoded or "null")
        if row is None:
            return None
        found: uuid.UUID = row["id"]
        links = await db.run_fork_links(conn, q, found)
        origin = [(r["run_id"], r["node"]) for r in links if r["what"] == "from"]
        if origin != [(plan.source, plan.node)]:
            what = f"origin (not a fork of run {plan.source} from node {plan.node!r})"
            raise SubmitConflictError(plan.name, plan.key, found, what=what)
        if plan.encoded is None:
            source = await db.run_payload(conn, q, plan.source)
            wanted = None if source is None else self._opened(source["input"])
        else:
            wanted = codec.decode(plan.encoded, Any)
        if self._opened(row["input"]) != wanted:
            raise SubmitConflictError(plan.name, plan.key, found)
        return found

    def _opened(self, stored: str) -> Any:
        return codec.decode(reveal(self.cipher, stored), Any)


def _definition(
    name: str,
    run_id: uuid.UUID,
    nodes: Sequence[str],
    edges: Sequence[tuple[str, str, str | None]],
) -> Submittable[Any]:
    """The workflow defined in this process under ``name`` whose graph is the run's."""
    named = [wf for wf in defined_workflows() if wf.name == name]
    if not named:
        raise UnknownKindError(
            f"workflow {name!r} of run {run_id} is not defined in this process: a fork runs "
            f"the current definition, so fork from a process that imports it"
        )
    mismatch: InvalidStateError | None = None
    for workflow in named:  # a define and a define_result workflow may share a name
        try:
            workflow.check_run_graph(run_id, list(nodes), list(edges))
        except InvalidStateError as exc:
            mismatch = exc
        else:
            return workflow
    assert mismatch is not None
    raise mismatch
