"""Child runs submitted by a worker's completer: each completed child node's attempt output
is its child's input, and the run is written in the transaction that completes the attempt,
in a batch with the others (``Completer(spawn=...)``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from cyclone._enqueue.insert import target_for
from cyclone._enqueue.targets import DatabaseTarget
from cyclone._enqueue.wakeups import TrackedConnection
from cyclone._model import codec
from cyclone._model.nodes import ChildStep
from cyclone._model.wakeups import Wakeups
from cyclone._services.transitions import Effects
from cyclone._storage import queries as db
from cyclone._worker.outcomes import Completed

if TYPE_CHECKING:
    from cyclone._model.plans import SubmitPlan
    from cyclone._model.steps import Step
    from cyclone._model.workflows import Workflow
    from cyclone._worker.ports import WorkerClient


class ChildSpawner:
    """Submits the child runs of completed child nodes on the completion's connection."""

    def __init__(self, client: WorkerClient, steps: Mapping[str, Step[Any, Any]]) -> None:
        self._client = client
        self._children = {
            name: cast("Workflow[Any]", step.workflow)
            for name, step in steps.items()
            if isinstance(step, ChildStep)
        }

    def __bool__(self) -> bool:
        return bool(self._children)

    async def __call__(
        self, conn: db.Conn, outcomes: Sequence[Completed]
    ) -> tuple[Effects, list[uuid.UUID]]:
        """Submit each outcome's child run, linked to its node (the parent runs locked by
        the caller): those without map nodes, joins or branches in one statement, the
        others one by one; the queues to wake once the transaction commits, and the runs."""
        wakeups = Wakeups()
        tracked = TrackedConnection(conn, wakeups)
        target = target_for(self._client, tracked)
        plain: list[SubmitPlan] = []
        runs = []
        for o in outcomes:
            claimed = o.claimed
            assert claimed.node is not None
            workflow = self._children[claimed.kind]
            value = codec.decode(o.output, workflow.input_type)
            # Keyed by the attempt's task: a task's attempts make one child between them
            # (fenced, only one completes), and a new attempt after a failed child, or a
            # retry of the run, gets a new task.
            key = f"{claimed.run_id}:{claimed.node}:{claimed.id}"
            parent = (claimed.run_id, claimed.node)
            plan = workflow.plan(self._client.payload_limit, key, value, {}, parent)
            if plan.shape is None and not plan.root_maps and isinstance(target, DatabaseTarget):
                plain.append(plan)
            else:
                runs.append((await target.write_run(plan))[0])
        if plain:
            assert isinstance(target, DatabaseTarget)
            runs.extend(await target.write_children(plain))
        return Effects(queues=wakeups.take()), runs
