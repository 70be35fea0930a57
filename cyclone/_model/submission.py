"""A defined workflow as the rest of Cyclone uses it (pure): its nodes, steps and output
types, which workers read; the plan of a submit, which the insert path writes, and of a
fork (``cyclone._model.forks``); the submit calls, which hand a submit to the client's insert
path (``cyclone._enqueue``).

:class:`Submittable` is the base of :class:`~cyclone._model.workflows.Workflow`, which adds
the nodes (``node``, ``map``, ``child``, ``wait``). A submit turns into a
:class:`~cyclone._model.plans.SubmitPlan` here, from the workflow's :class:`Layout`, made once
per definition until a node is added. :class:`Resulting` is a workflow whose runs have a typed
result, as ``map`` and ``child`` take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Unpack

from cyclone._model import codec
from cyclone._model.errors import InvalidInputError
from cyclone._model.forks import ForkPlan, check_graph, plan_copies
from cyclone._model.handles import ResultRun, Run
from cyclone._model.keys import validate_key, validate_name
from cyclone._model.maps import check_items
from cyclone._model.nodes import Node
from cyclone._model.options import SubmitOptions, check_options
from cyclone._model.plans import Layout, SubmitPlan
from cyclone._model.retention import Retention, check_retention
from cyclone._model.steps import Step

if TYPE_CHECKING:
    import uuid

    from cyclone._model.ports import ClientPort, Tx

In = TypeVar("In")
In_contra = TypeVar("In_contra", contravariant=True)
Out_co = TypeVar("Out_co", covariant=True)

SUBMIT_OPTIONS = SubmitOptions.__optional_keys__


class Resulting(Protocol[In_contra, Out_co]):
    """A workflow whose runs have a typed result (a ``ResultWorkflow``), as ``child`` takes it."""

    async def submit(
        self, client: ClientPort, input: In_contra, **options: Unpack[SubmitOptions]
    ) -> ResultRun[Out_co]: ...


class Submittable(Generic[In]):
    """A named workflow taking ``In`` and the nodes defined so far: what workers read of it,
    the plan of a submit, and ``submit`` and its siblings."""

    def __init__(self, name: str, input_type: Any, *, retention: Retention | None = None) -> None:
        self.name = validate_name(name, what="a workflow's name")
        codec.check_type(input_type, what=f"input of workflow {self.name!r}")
        self.input_type = input_type
        self.retention = check_retention(retention, what=f"retention of workflow {self.name!r}")
        self._nodes: dict[str, Node[Any]] = {}
        self._result: str | None = None
        self._layout: Layout | None = None

    # What workers need

    @property
    def nodes(self) -> list[Node[Any]]:
        """The nodes, in definition (topological) order."""
        return list(self._nodes.values())

    def get_node(self, name: str) -> Node[Any] | None:
        """The node named ``name``, if this definition has it."""
        return self._nodes.get(name)

    def steps(self) -> list[Step[Any, Any]]:
        """The steps with handlers used by this workflow (what a worker serving it runs)."""
        seen: dict[str, Step[Any, Any]] = {}
        for node in self._nodes.values():
            if isinstance(node.kind, Step):
                seen.setdefault(node.kind.name, node.kind)
        return list(seen.values())

    def output_types(self) -> dict[str, Any]:
        """Each node's output type, by node name."""
        return {n: nd.output_type for n, nd in self._nodes.items()}

    # Submitting

    async def submit(self, client: ClientPort, input: In, **options: Unpack[SubmitOptions]) -> Run:
        """Submit a new run in Cyclone's own transaction and wake workers after commit."""
        run, _ = await self._submit(client, None, None, input, options)
        return run

    async def submit_tx(
        self, client: ClientPort, tx: Tx, input: In, **options: Unpack[SubmitOptions]
    ) -> Run:
        """Submit a new run in the caller's open transaction ``tx``."""
        run, _ = await self._submit(client, tx, None, input, options)
        return run

    async def submit_once(
        self, client: ClientPort, key: str, input: In, **options: Unpack[SubmitOptions]
    ) -> tuple[Run, bool]:
        """Submit the one run of ``key``; ``created`` is True only for the call that made it.

        A different input for an existing key raises :class:`SubmitConflictError`.
        """
        return await self._submit(client, None, validate_key(key), input, options)

    async def submit_once_tx(
        self, client: ClientPort, tx: Tx, key: str, input: In, **options: Unpack[SubmitOptions]
    ) -> tuple[Run, bool]:
        """``submit_once`` in the caller's open transaction ``tx``."""
        return await self._submit(client, tx, validate_key(key), input, options)

    def _result_node(self) -> str | None:
        return None

    def plan(
        self,
        payload_limit: int,
        key: str | None,
        input: In,
        options: Mapping[str, Any],
        parent: tuple[uuid.UUID, str] | None = None,
    ) -> SubmitPlan:
        """Check a submit and return what it writes (nothing is written here); ``parent``:
        the run and node submitting it as a child."""
        opts = check_options(options, SUBMIT_OPTIONS, call="submit")
        if not self._nodes:
            raise InvalidInputError(f"workflow {self.name!r} has no nodes")
        result_node = self._result_node()
        encoded = codec.encode(
            input,
            self.input_type,
            what=f"input of workflow {self.name!r}",
            limit=payload_limit,
        )
        check_items(self.name, self._nodes.values(), input)
        key = None if key is None else validate_key(key)
        layout = self._laid_out()
        return SubmitPlan.of(self.name, layout, input, encoded, key, result_node, opts, parent)

    def _laid_out(self) -> Layout:
        if self._layout is None:  # made once, until a node is added
            self._layout = Layout.of(list(self._nodes.values()))
        return self._layout

    def check_run_graph(
        self, run_id: uuid.UUID, nodes: list[str], edges: list[tuple[str, str, str | None]]
    ) -> None:
        """Raise :class:`InvalidStateError` unless a run's stored ``nodes`` (not items) and
        ``edges`` (parent, child, condition as JSON text) are this definition's graph."""
        check_graph(self.name, run_id, self._laid_out(), nodes, edges)

    def plan_fork(
        self,
        payload_limit: int,
        source: tuple[uuid.UUID, Mapping[str, str]],
        node: str,
        input: Any,
        key: str | None,
    ) -> ForkPlan:
        """Check a fork of ``source`` (the run and its nodes' states; its graph is this
        definition's) from ``node`` with ``input`` (None: the run's own) and return what it
        writes (nothing is written here)."""
        run_id, states = source
        layout = self._laid_out()
        copied, deps = plan_copies(layout, run_id, node, states)
        encoded = None
        if input is not None:
            what = f"input of workflow {self.name!r}"
            encoded = codec.encode(input, self.input_type, what=what, limit=payload_limit)
            check_items(self.name, self._nodes.values(), input)
        key = None if key is None else validate_key(key)
        return ForkPlan(
            run_id, node, self.name, encoded, key, self._result_node(), layout, copied, deps
        )

    async def _submit(
        self,
        client: ClientPort,
        tx: object,
        key: str | None,
        input: In,
        options: Mapping[str, Any],
    ) -> tuple[Run, bool]:
        return await client.services.inserter.submit(tx, self, key, input, options)
