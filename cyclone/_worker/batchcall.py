"""One call of a batch handler, and what it becomes: an outcome value per item.

As the executor does for one attempt (``executor.py``), it turns what happened into
outcomes; the handler's shared completion transaction, if it opened one, is the only thing
written here (by the completer, with every completed item in it)::

    handler returned a list, one result per input:
        a value          -> Completed (encoded; an encoding error fails that item alone)
        ItemFailed(exc)  -> Retry or Failed, as if that item's handler raised exc
    raised Snooze        -> every item Snoozed
    raised (or timed out, or returned the wrong number of results)
                         -> every item Retry or Failed
    cancelled by shutdown -> every item HandedBack

With a completion transaction, the completed items are completed in it and committed
together with the handler's writes: if any item of the batch lost its task, or the commit
fails, none of them completes (each fails its attempt with the reason, and is retried).
The items that failed on their own are written apart from it, as any failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone._model import codec
from cyclone._model.batches import BatchStep, HandlerBatchContext, ItemFailed
from cyclone._model.context import HandlerScope, Snooze
from cyclone._model.errors import CycloneError, InvalidStateError
from cyclone._services.database import Database
from cyclone._worker.completer import Completer
from cyclone._worker.completion import CompletionTx
from cyclone._worker.executor import Executor
from cyclone._worker.leases import LeaseKeeper
from cyclone._worker.outcomes import (
    Claimed,
    Completed,
    CompletionAborted,
    HandedBack,
    Outcome,
    Snoozed,
)

Result = tuple[Outcome, bool | None]
"""An item's outcome, and whether the database took it (None: it is still to be written)."""


@dataclass(eq=False, slots=True)
class Item:
    """One attempt of a batch kind: its decoded input, and its result once its batch ran."""

    claimed: Claimed
    value: Any
    result: asyncio.Future[Result]
    batch: asyncio.Task[None] | None = None  # the batch it runs in, once flushed
    gone: bool = False  # its task ended before its batch did (lost, or cancelled)


class BatchCall:
    """Runs batches of one worker: ``new_context`` makes each handler's context, ``executor``
    says what a failed attempt becomes, ``completer`` commits a shared completion
    transaction, ``leases`` learns when the handler is over."""

    def __init__(
        self,
        database: Database,
        *,
        executor: Executor,
        completer: Completer,
        leases: LeaseKeeper,
        new_context: Callable[..., HandlerBatchContext[Any]],
        output_limit: int,
    ) -> None:
        self._database = database
        self._executor = executor
        self._completer = completer
        self._leases = leases
        self._new_context = new_context
        self._output_limit = output_limit

    async def __call__(
        self, step: BatchStep[Any, Any], queue: str, group: Hashable, items: list[Item]
    ) -> None:
        """Run the handler for ``items`` and resolve each item's result."""
        try:
            results = await self._run(step, queue, group, items)
        except asyncio.CancelledError:  # shutdown: the items go back
            results = [(HandedBack(i.claimed), None) for i in items]
        except Exception as exc:  # supervised: the items' leases run out and they are reclaimed
            for item in items:
                if not item.result.done():
                    item.result.set_exception(exc)
            return
        for item, result in zip(items, results, strict=True):
            if not item.result.done():
                item.result.set_result(result)

    async def _run(
        self, step: BatchStep[Any, Any], queue: str, group: Hashable, items: list[Item]
    ) -> list[Result]:
        claimed = [i.claimed for i in items]
        completion = CompletionTx(self._database)
        scope = HandlerScope()
        ctx = self._new_context(
            step.name, queue, group, claimed, completion=completion, scope=scope
        )
        try:
            scope.bind()
            try:
                if step.timeout is None:
                    returned = await step.batch_handler(ctx, [i.value for i in items])
                else:
                    async with asyncio.timeout(step.timeout):
                        returned = await step.batch_handler(ctx, [i.value for i in items])
            finally:
                scope.close()
                # What is left is writing the outcomes, which the heartbeat must not cancel.
                for c in claimed:
                    self._leases.finishing(c)
            results = _results(step, returned, len(items))
        except Snooze as snooze:
            await completion.rollback()
            return [(Snoozed(c, snooze.delay), None) for c in claimed]
        except asyncio.CancelledError:
            await asyncio.shield(completion.rollback())
            raise
        except Exception as exc:
            await completion.rollback()
            timeout = isinstance(exc, TimeoutError) and step.timeout is not None
            return [(self._executor.failure(c, exc, timeout=timeout), None) for c in claimed]
        outcomes: list[Outcome] = []
        for c, result in zip(claimed, results, strict=True):
            if isinstance(result, ItemFailed):
                outcomes.append(self._executor.failure(c, result.error))
                continue
            try:
                output = self._executor.sealed(
                    codec.encode(
                        result,
                        step.output_type,
                        what=f"output of step {step.name!r}",
                        limit=self._output_limit,
                    )
                )
            except CycloneError as exc:  # not encodable, or too large: this item fails
                outcomes.append(self._executor.failure(c, exc))
                continue
            outcomes.append(Completed(c, output, completion if completion.opened else None))
        if not completion.opened:
            return [(o, None) for o in outcomes]
        return await self._commit(items, outcomes, completion)

    async def _commit(
        self, items: list[Item], outcomes: list[Outcome], completion: CompletionTx
    ) -> list[Result]:
        """Complete the completed items in the shared completion transaction, all or none."""
        completed = [o for o in outcomes if isinstance(o, Completed)]
        if not completed or any(i.gone for i in items):
            await completion.rollback()
            aborted = CompletionAborted(
                "another item of its batch lost its task before the batch's completion "
                "transaction committed; the handler's writes in it were rolled back"
            )
            return [(self._aborted(o, aborted), None) for o in outcomes]
        try:
            accepted = await self._completer.commit(completed)
        except CompletionAborted as exc:
            return [(self._aborted(o, exc), None) for o in outcomes]
        if len(accepted) == len(completed):
            return [(o, True) if isinstance(o, Completed) else (o, None) for o in outcomes]
        # Some attempt no longer owned its task: the transaction was rolled back, and the
        # items that still own theirs fail this attempt.
        rejected = CompletionAborted(
            "another item of its batch lost its task, so the batch's completion transaction "
            "was rolled back with the handler's writes"
        )
        results: list[Result] = []
        for o in outcomes:
            if isinstance(o, Completed) and o.claimed.key not in accepted:
                results.append((o, False))
            else:
                results.append((self._aborted(o, rejected), None))
        return results

    def _aborted(self, outcome: Outcome, exc: CompletionAborted) -> Outcome:
        """A completed item whose shared completion did not commit fails its attempt."""
        if isinstance(outcome, Completed):
            return self._executor.failure(outcome.claimed, exc)
        return outcome


def _results(step: BatchStep[Any, Any], returned: Any, count: int) -> Sequence[Any]:
    """The handler's results, one per input (an action may return None: all complete)."""
    if returned is None and step.output_type is type(None):
        return [None] * count
    if not isinstance(returned, Sequence) or isinstance(returned, str | bytes):
        raise InvalidStateError(
            f"batch step {step.name!r} returned {codec.type_name(type(returned))}: return a "
            f"list with one result per input ({count}), in order"
        )
    if len(returned) != count:
        raise InvalidStateError(
            f"batch step {step.name!r} returned {len(returned)} results for {count} inputs: "
            "return one result per input, in order (cyclone.ItemFailed for an item that failed)"
        )
    return returned
