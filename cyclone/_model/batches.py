"""Batch steps: one handler call for many jobs of a kind, each job keeping its own outcome.

A :class:`BatchStep` is a step whose handler takes a list of inputs and returns one result
per input, in order; an item whose result is an :class:`ItemFailed` fails (and retries) on
its own. The worker gathers claimed jobs of the kind into batches (``_worker/batches.py``);
this module only declares them and the context their handler gets.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Unpack, cast

from cyclone._model.context import C, Completion, HandlerAttempt, HandlerScope
from cyclone._model.errors import ContextError, InvalidInputError
from cyclone._model.options import seconds
from cyclone._model.retention import check_retention
from cyclone._model.steps import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, Kind, Step, StepOptions

if TYPE_CHECKING:
    import asyncpg

    from cyclone._model.ports import Tx

In = TypeVar("In")
Out = TypeVar("Out")
BCtx = TypeVar("BCtx", bound="HandlerBatchContext[Any]")

BatchHandler = Callable[[BCtx, list[In]], Awaitable[Sequence[Out | "ItemFailed"]]]
BatchActionHandler = Callable[[BCtx, list[In]], Awaitable[Sequence["ItemFailed | None"] | None]]

MAX_SIZE_LIMIT = 10_000


class ItemFailed:
    """Return this in an item's place from a batch handler: that item's attempt fails with
    ``error`` (and is retried while it has attempts left); the other items complete."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        if not isinstance(error, Exception):
            raise InvalidInputError(
                f"ItemFailed takes the exception the item failed with, not {error!r}"
            )
        self.error = error

    def __repr__(self) -> str:
        return f"cyclone.ItemFailed({self.error!r})"


class HandlerBatchContext(Generic[C]):
    """What a batch handler knows about its call, passed as its first argument: ``client``
    is a ``C``; ``cyclone.BatchContext`` is it with the facade's ``cyclone.Client``."""

    def __init__(
        self,
        client: C,
        kind: str,
        queue: str,
        group: Hashable,
        attempts: Sequence[HandlerAttempt],
        *,
        completion: Completion | None = None,
        scope: HandlerScope | None = None,
    ) -> None:
        self.client = client
        self.kind = kind
        self.queue = queue
        self.group = group
        self.attempts = list(attempts)
        self._completion = completion
        self._scope = scope or HandlerScope()

    def __repr__(self) -> str:
        return f"<cyclone.BatchContext {self.kind!r} group={self.group!r} items={len(self)}>"

    def __len__(self) -> int:
        return len(self.attempts)

    async def completion_tx(self) -> asyncpg.pool.PoolConnectionProxy:
        """The batch's completion transaction: a pooled asyncpg connection in a transaction.

        Business writes on it commit atomically with the completion of every item that
        completes (not returned as :class:`ItemFailed`), and roll back with them: if any of
        those items lost its task meanwhile, or the commit fails, none of them completes.
        Do not commit it.
        """
        self._scope.check("completion_tx()")
        if self._completion is None:
            raise ContextError("this context has no completion transaction")
        await self._completion.open()
        return cast("asyncpg.pool.PoolConnectionProxy", self._completion.connection)

    # Internal, for cyclone.enqueue_completion and submit_completion, as HandlerContext's.
    async def completion_tracked(self) -> Tx:
        self._scope.check("a completion enqueue")
        if self._completion is None:
            raise ContextError("this context has no completion transaction")
        return cast("Tx", await self._completion.open())


class BatchStep(Step[In, Out]):
    """A step whose handler runs for many jobs at once: ``handler(ctx, inputs) -> results``.

    Enqueued like any step, one job per input. Calling it runs the handler on a batch of
    one (handy in unit tests): it returns that item's result, or raises its ``ItemFailed``
    error.
    """

    def __init__(
        self,
        name: str,
        handler: Callable[[Any, list[Any]], Awaitable[Any]],
        *,
        max_size: int = 100,
        max_wait: float = 1.0,
        group_by: Callable[[Any], Hashable] | None = None,
        action: bool = False,
        **options: Unpack[StepOptions],
    ) -> None:
        if unknown := sorted(set(options) - StepOptions.__optional_keys__):
            known = ", ".join(sorted(StepOptions.__optional_keys__))
            raise InvalidInputError(
                f"batch step {name!r} got unknown options {', '.join(unknown)}: it takes "
                f"max_size, max_wait, group_by and {known}"
            )
        input_type, output_type = _batch_signature(name, handler, action=action)
        Kind.__init__(
            self,
            name,
            input_type,
            output_type,
            queue=options.get("queue", DEFAULT_QUEUE),
            max_attempts=options.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
            priority=options.get("priority", 0),
        )
        self.retention = check_retention(
            options.get("retention"), what=f"retention of batch step {self.name!r}"
        )
        timeout = options.get("timeout")
        self.batch_handler = handler
        self.handler = self._one
        self.is_sync = False  # a batch handler is a coroutine function
        self.timeout = None if timeout is None else seconds(timeout, what="timeout")
        if isinstance(max_size, bool) or not isinstance(max_size, int):
            raise InvalidInputError(f"max_size must be an int, not {max_size!r}")
        if not 1 <= max_size <= MAX_SIZE_LIMIT:
            raise InvalidInputError(
                f"max_size of batch step {name!r} must be between 1 and {MAX_SIZE_LIMIT}, "
                f"not {max_size}"
            )
        self.max_size = max_size
        self.max_wait = seconds(max_wait, what="max_wait")
        if group_by is not None and not callable(group_by):
            raise InvalidInputError(
                f"group_by of batch step {name!r} must be a function of the input, not {group_by!r}"
            )
        self.group_by = group_by

    async def _one(self, ctx: Any, input: Any) -> Any:
        """The handler on a batch of one: its result, or its ``ItemFailed`` error raised."""
        results = await self.batch_handler(ctx, [input])
        if results is None:
            return None
        [result] = results
        if isinstance(result, ItemFailed):
            raise result.error
        return result


def refuse_node(step: object) -> None:
    """Refuse a batch step as a workflow node: a node runs on its own."""
    if isinstance(step, BatchStep):
        raise InvalidInputError(
            f"batch step {step.name!r} cannot be a workflow node: a node's handler runs for "
            "that node alone. Declare a @cyclone.step for the node, or enqueue the batch "
            "kind's jobs from a node with cyclone.enqueue_completion"
        )


def _batch_signature(name: str, handler: Callable[..., Any], *, action: bool) -> tuple[Any, Any]:
    """The item input and output types of a batch handler, from its annotations:
    ``(ctx, inputs: list[In]) -> list[Out | ItemFailed]`` (an action: ``-> None``)."""
    if not inspect.iscoroutinefunction(handler):
        raise InvalidInputError(
            f"the handler of batch step {name!r} must be an async function (async def); a "
            "blocking call in it goes through await anyio.to_thread.run_sync(...)"
        )
    params = list(inspect.signature(handler).parameters.values())
    if len(params) != 2:
        raise InvalidInputError(
            f"the handler of batch step {name!r} must take (ctx, inputs), it takes {len(params)}"
        )
    hints = typing.get_type_hints(handler, include_extras=True)
    inputs = hints.get(params[1].name)
    if typing.get_origin(inputs) not in (list, collections.abc.Sequence) or not typing.get_args(
        inputs
    ):
        raise InvalidInputError(
            f"annotate the inputs parameter of batch step {name!r} as list[InputType]"
        )
    if "return" not in hints:
        raise InvalidInputError(f"annotate the return type of batch step {name!r}")
    returned = hints["return"]
    if returned is None or returned is type(None):
        if not action:
            raise InvalidInputError(
                f"batch step {name!r} returns None: declare it with @cyclone.batch_action, "
                "or return one result per input"
            )
        return typing.get_args(inputs)[0], type(None)
    item = _item_type(returned)
    if item is None:
        raise InvalidInputError(
            f"batch step {name!r} must return list[OutputType] (an item may be "
            f"cyclone.ItemFailed), not {returned!r}"
        )
    if action and item is not type(None):
        raise InvalidInputError(
            f"batch action {name!r} returns outputs: an action's items have none; return "
            "None or list[cyclone.ItemFailed | None], or declare it with @cyclone.batch_step"
        )
    return typing.get_args(inputs)[0], item


def _item_type(returned: Any) -> Any:
    """The output type of one item in ``list[Out | ItemFailed]`` (None if not a list)."""
    if typing.get_origin(returned) in (typing.Union, types.UnionType):  # action: ... | None
        lists = [a for a in typing.get_args(returned) if a is not type(None)]
        if len(lists) != 1:
            return None
        returned = lists[0]
    if typing.get_origin(returned) not in (list, collections.abc.Sequence):
        return None
    [item] = typing.get_args(returned) or (None,)
    if item is None:
        return None
    if typing.get_origin(item) in (typing.Union, types.UnionType):
        kept = [a for a in typing.get_args(item) if a is not ItemFailed]
        if len(kept) == 1:
            return kept[0]
        return typing.Union[tuple(kept)]  # noqa: UP007
    return type(None) if item is ItemFailed else item


def batch_step(
    name: str,
    *,
    max_size: int = 100,
    max_wait: float = 1.0,
    group_by: Callable[[Any], Hashable] | None = None,
    **options: Unpack[StepOptions],
) -> Callable[[BatchHandler[BCtx, In, Out]], BatchStep[In, Out]]:
    """Declare a batch step: ``async def handler(ctx, inputs: list[In]) -> list[Out]``.

    Jobs of the kind are enqueued one by one; a worker calls the handler once for up to
    ``max_size`` of them, after at most ``max_wait`` seconds from the first one it holds, or
    as soon as its queue's slots all hold waiting items. With ``group_by`` (a function of
    one input giving a hashable key) only inputs with equal keys share a call. The handler
    returns one result per input, in order; :class:`ItemFailed` in an item's place fails
    that item alone. Raising (or ``Snooze``) fails (or snoozes) every item of the call.
    Other options are :func:`cyclone.step`'s; ``timeout`` bounds the whole call.
    """

    def decorate(handler: BatchHandler[BCtx, In, Out]) -> BatchStep[In, Out]:
        return BatchStep(
            name, handler, max_size=max_size, max_wait=max_wait, group_by=group_by, **options
        )

    return decorate


def batch_action(
    name: str,
    *,
    max_size: int = 100,
    max_wait: float = 1.0,
    group_by: Callable[[Any], Hashable] | None = None,
    **options: Unpack[StepOptions],
) -> Callable[[BatchActionHandler[BCtx, In]], BatchStep[In, None]]:
    """Declare a batch step whose items have no output: the handler returns ``None`` (every
    item completes) or a list of ``None`` and :class:`ItemFailed`, one per input. Its options
    are :func:`batch_step`'s."""

    def decorate(handler: BatchActionHandler[BCtx, In]) -> BatchStep[In, None]:
        return BatchStep(
            name,
            handler,
            max_size=max_size,
            max_wait=max_wait,
            group_by=group_by,
            action=True,
            **options,
        )

    return decorate
