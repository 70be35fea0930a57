"""Workflows with a typed result, and the two ways to define a workflow (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, Unpack, overload

from cyclone._model import codec
from cyclone._model.errors import InvalidInputError, UnknownNodeError
from cyclone._model.handles import ResultRun
from cyclone._model.nodes import Node, accepts
from cyclone._model.options import SubmitOptions
from cyclone._model.retention import Retention
from cyclone._model.steps import Kind
from cyclone._model.workflows import Workflow

if TYPE_CHECKING:
    from cyclone._model.ports import ClientPort, Tx

In = TypeVar("In")
Out = TypeVar("Out")


class ResultWorkflow(Workflow[In], Generic[In, Out]):
    """A workflow whose run has a typed result: the output of its result node."""

    def __init__(
        self, name: str, input_type: Any, output_type: Any, *, retention: Retention | None = None
    ) -> None:
        if retention is not None and retention.keeps_nothing:
            raise InvalidInputError(
                f"result workflow {name!r} cannot keep nothing once completed: run.result() "
                "reads the completed run. Keep completed runs a while (a short "
                "Retention(completed=...)), or use cyclone.define for a workflow without a "
                "result"
            )
        super().__init__(name, input_type, retention=retention)
        codec.check_type(output_type, what=f"result of workflow {self.name!r}")
        self.output_type = output_type

    def set_result(self, node: Node[Out]) -> None:
        """Make ``node`` (a step node of this workflow) the run's result."""
        if not isinstance(node, Node) or self._nodes.get(node.name) is not node:
            name = node.name if isinstance(node, Node) else repr(node)
            raise UnknownNodeError(f"{node!r} is not a node of workflow {self.name!r}", name)
        if node.kind is not None and not accepts(self.output_type, node.output_type):
            raise InvalidInputError(
                f"node {node.name!r} outputs {codec.type_name(node.output_type)}, "
                f"not the workflow result {codec.type_name(self.output_type)}"
            )
        self._result = node.name

    def _result_node(self) -> str | None:
        if self._result is None:
            raise InvalidInputError(f"result workflow {self.name!r} has no result node set")
        return self._result

    async def submit(
        self, client: ClientPort, input: In, **options: Unpack[SubmitOptions]
    ) -> ResultRun[Out]:
        """Submit a new run; ``await run.result()`` gives the typed result."""
        run = await super().submit(client, input, **options)
        assert isinstance(run, ResultRun)
        return run

    async def submit_tx(
        self, client: ClientPort, tx: Tx, input: In, **options: Unpack[SubmitOptions]
    ) -> ResultRun[Out]:
        """Submit a new run in the caller's transaction."""
        run = await super().submit_tx(client, tx, input, **options)
        assert isinstance(run, ResultRun)
        return run

    async def submit_once(
        self, client: ClientPort, key: str, input: In, **options: Unpack[SubmitOptions]
    ) -> tuple[ResultRun[Out], bool]:
        """The one run of ``key``, with a typed result."""
        run, created = await super().submit_once(client, key, input, **options)
        assert isinstance(run, ResultRun)
        return run, created

    async def submit_once_tx(
        self, client: ClientPort, tx: Tx, key: str, input: In, **options: Unpack[SubmitOptions]
    ) -> tuple[ResultRun[Out], bool]:
        """``submit_once`` in the caller's transaction, with a typed result."""
        run, created = await super().submit_once_tx(client, tx, key, input, **options)
        assert isinstance(run, ResultRun)
        return run, created


@overload
def define(
    name: str, input_type: type[In], *, retention: Retention | None = None
) -> Workflow[In]: ...
@overload
def define(name: str, input_type: Any, *, retention: Retention | None = None) -> Workflow[Any]: ...
def define(name: str, input_type: Any, *, retention: Retention | None = None) -> Workflow[Any]:
    """Define a workflow named ``name`` taking ``input_type``; add nodes with ``node``.

    ``retention`` (a :class:`Retention`) keeps this workflow's ended runs for its own ages
    instead of the client's; the workers given the workflow purge them.
    """
    return Workflow(name, input_type, retention=retention)


@overload
def define_result(
    name: str, input_type: type[In], output_type: type[Out], *, retention: Retention | None = None
) -> ResultWorkflow[In, Out]: ...
@overload
def define_result(
    name: str, input_type: Any, output_type: Any, *, retention: Retention | None = None
) -> ResultWorkflow[Any, Any]: ...
def define_result(
    name: str, input_type: Any, output_type: Any, *, retention: Retention | None = None
) -> ResultWorkflow[Any, Any]:
    """Define a workflow with a typed result; pick the result node with ``set_result``.

    ``retention`` is :func:`define`'s, except that it cannot keep nothing once completed:
    ``run.result()`` reads the completed run.
    """
    return ResultWorkflow(name, input_type, output_type, retention=retention)


def require_workflow(workflow: object, *, call: str) -> None:
    """Refuse anything but a workflow as the workflow of ``cyclone.<call>()`` (its name, a
    step): the call would fail later with an ``AttributeError``."""
    if isinstance(workflow, Workflow):
        return
    if isinstance(workflow, Kind):
        instead = (
            f"a step is enqueued, not submitted: use cyclone.{call.replace('submit', 'enqueue')}"
        )
    else:
        instead = "pass the workflow object itself"
    raise InvalidInputError(
        f"cyclone.{call}() takes a workflow from cyclone.define(...) or "
        f"cyclone.define_result(...), got {codec.type_name(type(workflow))} {workflow!r}: "
        f"{instead}"
    )
