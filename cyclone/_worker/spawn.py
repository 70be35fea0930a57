"""Child runs submitted by a worker's completer: each completed child node's attempt output
is its child's input, and the run is written in the transaction that completes the attempt,
in a batch with the others (``Completer(spawn=...)``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from cyclone._enqueue.insert import Inserter, Parts
from cyclone._enqueue.targets import DatabaseTarget
from cyclone._enqueue.wakeups import TrackedConnection
from cyclone._model import codec
from cyclone._model.keyring import reveal
from cyclone._model.nodes import ChildStep
from cyclone._model.wakeups import Wakeups
from cyclone._services.transitions import Effects
from cyclone._storage import queries as db
from cyclone._worker.outcomes import Completed

if TYPE_CHECKING:
    from cyclone._model.plans import SubmitPlan
    from cyclone._model.steps import Step
    from cyclone._model.workflows import Workflow


class ChildSpawner:
    """Submits the child runs of completed child nodes on the completion's connection."""

    def __init__(self, parts: Parts, steps: Mapping[str, Step[Any, Any]]) -> None:
        self._inserter = Inserter(parts)
        self._payload_limit = parts.settings.payload_limit
        self._cipher = parts.settings.cipher
        self._children = {
            name: cast("Workflow[Any]", step.workflow)
            for name, step in steps.items()
            if isinstance(step, ChildStep)
        }
        # The plans of the child runs of attempts that completed, made as each outcome
        # arrives rather than under the batch's locks; taken by the write.
        self._plans: dict[tuple[int, int], SubmitPlan] = {}

    def __bool__(self) -> bool:
        return bool(self._children)

    def prepare(self, outcome: Completed) -> None:
        """Plan the child run of a completed child node's attempt (other outcomes: nothing)."""
        if outcome.claimed.kind in self._children:
            try:
                self._plans[outcome.claimed.key] = self._plan(outcome)
            except Exception:  # planned again by the write, which raises it where it belongs
                return

    def forget(self, outcomes: Sequence[Completed]) -> None:
        """Drop the plans of attempts whose completions were rejected."""
        for o in outcomes:
            self._plans.pop(o.claimed.key, None)

    def _plan(self, outcome: Completed) -> SubmitPlan:
        claimed = outcome.claimed
        assert claimed.node is not None
        workflow = self._children[claimed.kind]
        output = outcome.output  # as stored: sealed when the client has a keyring
        value = codec.decode(reveal(self._cipher, output), workflow.input_type)
        # Keyed by the attempt's task: a task's attempts make one child between them
        # (fenced, only one completes), and a new attempt after a failed child, or a
        # retry of the run, gets a new task.
        key = f"{claimed.run_id}:{claimed.node}:{claimed.id}"
        parent = (claimed.run_id, claimed.node)
        return workflow.plan(self._payload_limit, key, value, {}, parent)

    async def __call__(
        self, conn: db.Conn, outcomes: Sequence[Completed]
    ) -> tuple[Effects, list[uuid.UUID]]:
        """Submit each outcome's child run, linked to its node (the parent runs locked by
        the caller): those without map nodes, joins or branches in one statement, the
        others one by one; the queues to wake once the transaction commits, and the runs."""
        wakeups = Wakeups()
        tracked = TrackedConnection(conn, wakeups)
        target = self._inserter.target(tracked)
        plain: list[SubmitPlan] = []
        runs = []
        for o in outcomes:
            # Planned when it arrived; again if an earlier try of this write took the plan.
            plan = self._plans.pop(o.claimed.key, None) or self._plan(o)
            if plan.shape is None and not plan.root_maps and isinstance(target, DatabaseTarget):
                plain.append(plan)
            else:
                runs.append((await target.write_run(plan))[0])
        if plain:
            assert isinstance(target, DatabaseTarget)
            runs.extend(await target.write_children(plain))
        return Effects(queues=wakeups.take()), runs
