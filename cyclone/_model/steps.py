"""Step kinds: what a worker can run and a producer can enqueue.

A :class:`Kind` names a kind of work with its input and output types and its defaults (queue,
attempts, priority). A :class:`Step` is a kind with a handler. ``register_kind`` declares a
kind in a process that only enqueues it (the handler lives in another service).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, Unpack, cast, overload

import anyio.to_thread

from cyclone._model import codec
from cyclone._model.context import HandlerContext
from cyclone._model.errors import InvalidInputError
from cyclone._model.handles import ResultRun
from cyclone._model.keys import validate_name
from cyclone._model.options import EnqueueManyOptions, EnqueueOptions, validate_int, validate_queue

if TYPE_CHECKING:
    import datetime as dt

    from cyclone._model.ports import ClientPort, Tx

In = TypeVar("In")
Out = TypeVar("Out")
# A kind taking ``object`` stands where one taking ``Order`` is wanted, and one giving
# ``bool`` where one giving ``int`` is.
In_contra = TypeVar("In_contra", contravariant=True)
Out_co = TypeVar("Out_co", covariant=True)

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 10

# A handler takes its context and its input. The context is ``cyclone.Context`` (a
# HandlerContext whose ``client`` is the facade's Client, a layer above this one), or any
# HandlerContext a handler is annotated with.
Ctx = TypeVar("Ctx", bound=HandlerContext[Any])
Handler = Callable[[Ctx, In], Awaitable[Out]]
# A plain ``def`` handler: the worker runs it in a thread (docs/sync-handlers.md).
SyncHandler = Callable[[Ctx, In], Out]


class Kind(Generic[In_contra, Out_co]):
    """A named kind of work with typed input and output; enqueue it as a standalone job.

    Its types are checked when it is declared: msgspec must be able to store them as JSON.
    Messages call every kind a step: a registered kind is a step whose handler runs
    elsewhere.
    """

    def __init__(
        self,
        name: str,
        input_type: Any,
        output_type: Any,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        priority: int = 0,
    ) -> None:
        self.name = validate_name(name, what="a kind's name")
        self.input_type = input_type
        self.output_type = type(None) if output_type is None else output_type
        codec.check_type(input_type, what=f"input of step {self.name!r}")
        codec.check_type(self.output_type, what=f"output of step {self.name!r}")
        self.queue = validate_queue(queue)
        self.max_attempts = validate_int(max_attempts, what="max_attempts", low=1)
        self.priority = validate_int(priority, what="priority", low=-(2**31 - 1))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} queue={self.queue!r}>"

    async def enqueue(
        self, client: ClientPort, input: In_contra, **options: Unpack[EnqueueOptions]
    ) -> ResultRun[Out_co]:
        """Enqueue one job in its own transaction and wake workers after the commit."""
        runs = await client.services.inserter.enqueue(None, self, [input], options)
        return runs[0]

    async def enqueue_tx(
        self, client: ClientPort, tx: Tx, input: In_contra, **options: Unpack[EnqueueOptions]
    ) -> ResultRun[Out_co]:
        """Enqueue one job in the caller's open transaction ``tx``; never commits it."""
        runs = await client.services.inserter.enqueue(tx, self, [input], options)
        return runs[0]

    async def enqueue_many(
        self, client: ClientPort, inputs: Sequence[In_contra], **options: Unpack[EnqueueManyOptions]
    ) -> list[ResultRun[Out_co]]:
        """Enqueue many jobs in one round trip; handles come in the order of ``inputs``."""
        return await client.services.inserter.enqueue(None, self, list(inputs), options)

    async def enqueue_many_tx(
        self,
        client: ClientPort,
        tx: Tx,
        inputs: Sequence[In_contra],
        **options: Unpack[EnqueueManyOptions],
    ) -> list[ResultRun[Out_co]]:
        """``enqueue_many`` in the caller's open transaction ``tx``."""
        return await client.services.inserter.enqueue(tx, self, list(inputs), options)


class Step(Kind[In_contra, Out_co]):
    """A kind with its handler: ``async def handler(ctx, input) -> output``, or a plain
    ``def`` one, which a worker runs in a thread (``is_sync``).

    Calling the step calls the handler (a plain one in a thread, as a worker does), which is
    handy in unit tests.
    """

    def __init__(
        self,
        name: str,
        handler: Handler[Any, In_contra, Out_co] | SyncHandler[Any, In_contra, Out_co],
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        priority: int = 0,
        timeout: float | dt.timedelta | None = None,
        output_type: Any = ...,
    ) -> None:
        from cyclone._model.options import seconds

        input_type, declared_output = _signature(name, handler)
        if output_type is not ... and declared_output is not output_type:
            # An action: its runs store no output, so a handler annotated to return one
            # would fail every attempt at its completion.
            raise InvalidInputError(
                f"action {name!r} is annotated -> {codec.type_name(declared_output)}, but an "
                "action returns None (it has no output): annotate it -> None, or declare it "
                "with @cyclone.step to keep its output"
            )
        super().__init__(
            name,
            input_type,
            declared_output if output_type is ... else output_type,
            queue=queue,
            max_attempts=max_attempts,
            priority=priority,
        )
        self.handler = handler
        self.is_sync = not inspect.iscoroutinefunction(handler)
        """True for a plain ``def`` handler, which a worker runs in a thread."""
        self.timeout = None if timeout is None else seconds(timeout, what="timeout")

    async def __call__(self, ctx: HandlerContext[Any], input: In_contra) -> Out_co:
        if self.is_sync:
            call = cast("SyncHandler[Any, In_contra, Out_co]", self.handler)
            return await anyio.to_thread.run_sync(call, ctx, input)
        return await cast("Handler[Any, In_contra, Out_co]", self.handler)(ctx, input)


def _signature(name: str, handler: Callable[..., Any]) -> tuple[Any, Any]:
    if inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler):
        raise InvalidInputError(
            f"the handler of step {name!r} is a generator: a handler returns its output, "
            "so write it as an async def (or a plain def, run in a thread) that returns it"
        )
    if not callable(handler) or isinstance(handler, type):
        raise InvalidInputError(
            f"the handler of step {name!r} must be a function (async def, or a plain def "
            f"that a worker runs in a thread), not {handler!r}"
        )
    params = list(inspect.signature(handler).parameters.values())
    if len(params) != 2:
        raise InvalidInputError(
            f"the handler of step {name!r} must take (ctx, input), it takes {len(params)}"
        )
    # With their extras: Annotated[int, msgspec.Meta(ge=0)] keeps the constraint it declares.
    hints = typing.get_type_hints(handler, include_extras=True)
    input_name = params[1].name
    if input_name not in hints:
        raise InvalidInputError(f"annotate the input parameter of step {name!r} with its type")
    if "return" not in hints:
        raise InvalidInputError(f"annotate the return type of step {name!r}")
    return hints[input_name], hints["return"]


class KindOptions(TypedDict, total=False):
    """A kind's defaults, as :class:`Kind` takes them: ``queue``, ``max_attempts``,
    ``priority``."""

    queue: str
    max_attempts: int
    priority: int


class StepOptions(KindOptions, total=False):
    """A step's defaults: a kind's, and the ``timeout`` of its handler."""

    timeout: float | dt.timedelta | None


class StepDecorator(Protocol):
    """What ``@cyclone.step(name)`` returns: it makes a step of an ``async def`` handler, or
    of a plain ``def`` one (which a worker runs in a thread)."""

    @overload
    def __call__(self, handler: Handler[Ctx, In, Out], /) -> Step[In, Out]: ...
    @overload
    def __call__(self, handler: SyncHandler[Ctx, In, Out], /) -> Step[In, Out]: ...


class ActionDecorator(Protocol):
    """What ``@cyclone.action(name)`` returns: a step of a handler that returns ``None``."""

    @overload
    def __call__(self, handler: Handler[Ctx, In, None], /) -> Step[In, None]: ...
    @overload
    def __call__(self, handler: SyncHandler[Ctx, In, None], /) -> Step[In, None]: ...


def step(name: str, **options: Unpack[StepOptions]) -> StepDecorator:
    """Declare a step: a handler with a stable kind name and its defaults.

    The input and output types come from the handler's annotations; msgspec decodes the
    input into the input type (validating it) before the handler runs.

    Options (:class:`StepOptions`): ``queue`` (``"default"``), ``max_attempts`` (10) and
    ``priority`` (0, higher first), defaults that an enqueue may override; and the
    handler's ``timeout`` in seconds or as a ``timedelta`` (None: no timeout).

    The handler is an ``async def``, or a plain ``def`` for blocking or CPU-bound code,
    which a worker runs in a thread (docs/sync-handlers.md).
    """

    def decorate(handler: Callable[[Any, Any], Any]) -> Step[Any, Any]:
        return Step(name, handler, **options)

    return cast("StepDecorator", decorate)


def action(name: str, **options: Unpack[StepOptions]) -> ActionDecorator:
    """Declare a step that produces no output (its handler returns ``None``); its options
    are :func:`step`'s, and its handler may be a plain ``def`` as theirs."""

    def decorate(handler: Callable[[Any, Any], Any]) -> Step[Any, None]:
        return Step(name, handler, output_type=type(None), **options)

    return cast("ActionDecorator", decorate)


@overload
def register_kind(
    name: str, input_type: type[In], output_type: None, **options: Unpack[KindOptions]
) -> Kind[In, None]: ...
@overload
def register_kind(
    name: str, input_type: type[In], output_type: type[Out], **options: Unpack[KindOptions]
) -> Kind[In, Out]: ...
@overload
def register_kind(
    name: str, input_type: Any, output_type: Any, **options: Unpack[KindOptions]
) -> Kind[Any, Any]: ...
def register_kind(
    name: str, input_type: Any, output_type: Any, **options: Unpack[KindOptions]
) -> Kind[Any, Any]:
    """Declare a kind without a handler, for a process that only enqueues it; its options
    (:class:`KindOptions`) are ``queue``, ``max_attempts`` and ``priority``, as
    :func:`step`'s."""
    return Kind(name, input_type, output_type, **options)


def require_kind(kind: object, *, call: str) -> None:
    """Refuse anything but a kind as the kind of ``cyclone.<call>()`` (a kind's name, a
    handler function): the call would fail later with an ``AttributeError``."""
    if isinstance(kind, Kind):
        return
    if isinstance(kind, str):
        instead = (
            f"pass the step itself, or declare the kind in this process with "
            f"cyclone.register_kind({kind!r}, InputType, OutputType) and pass that"
        )
    elif hasattr(kind, "submit_tx"):
        instead = (
            "a workflow is submitted, not enqueued: use workflow.submit(client, input), "
            "cyclone.submit_tx or cyclone.submit_completion"
        )
    elif callable(kind):
        instead = "decorate the function with @cyclone.step(name) and pass the step"
    else:
        instead = "pass the step itself"
    raise InvalidInputError(
        f"cyclone.{call}() takes a step (from @cyclone.step or @cyclone.action) or a kind "
        f"from cyclone.register_kind(...), got {codec.type_name(type(kind))} {kind!r}: "
        f"{instead}"
    )
