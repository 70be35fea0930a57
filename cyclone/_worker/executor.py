"""The executor: runs one attempt's handler and turns what happened into an outcome value.

It never writes to the database; only the handler does, through its own completion
transaction, which the executor rolls back when the attempt does not complete. What the
outcome becomes in the database is the completer's business; :meth:`Executor.report` then
tells the logs and observers what was accepted.

    handler returned           -> Completed (the encoded output, the completion transaction)
    raised Snooze(delay)       -> Snoozed
    raised, attempts left      -> Retry after the backoff (timeout= counts as a failure)
    raised, last attempt       -> Failed
    input cannot be decoded    -> Failed at once: no attempt of this code can succeed
    cancelled by shutdown      -> HandedBack
    cancelled, task lost       -> Lost
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from cyclone._model import codec
from cyclone._model.context import HandlerContext, HandlerScope, Snooze
from cyclone._model.errors import InvalidInputError, KeyringError
from cyclone._model.keyring import Keyring, reveal, sealed
from cyclone._model.sleeps import SleepStep
from cyclone._model.steps import Step
from cyclone._services.database import Database
from cyclone._services.observe import Observers
from cyclone._worker.completion import CompletionTx
from cyclone._worker.leases import LeaseKeeper
from cyclone._worker.outcomes import (
    Claimed,
    Completed,
    Failed,
    HandedBack,
    Lost,
    Outcome,
    Retry,
    Snoozed,
    error_message,
    error_record,
    error_type,
    lost_completion,
)
from cyclone._worker.threads import HandlerThreads

if TYPE_CHECKING:
    from cyclone._model.workflows import Workflow

logger = logging.getLogger("cyclone")

_NOT_OWNED = (
    "the attempt no longer owns its task (the run was cancelled, or the lease expired and "
    "another worker took the task over)"
)


class Executor:
    """Runs handlers of ``steps`` (and of the nodes of ``workflows``) for one worker.

    ``new_context`` makes a handler's context from its fields: the client's, so that
    ``ctx.client`` is the worker's client. An output over ``output_limit`` bytes fails its
    attempt. At most ``threads`` plain ``def`` handlers run at once, each in a thread.
    """

    def __init__(
        self,
        steps: Mapping[str, Step[Any, Any]],
        workflows: Mapping[str, Workflow[Any]],
        *,
        database: Database,
        backoff: Callable[[int], float],
        leases: LeaseKeeper,
        output_limit: int,
        cipher: Keyring | None = None,
        observers: Observers,
        new_context: Callable[..., HandlerContext[Any]],
        threads: int,
    ) -> None:
        self._threads = HandlerThreads(threads)
        self._database = database
        self._output_limit = output_limit
        self._cipher = cipher
        self._observers = observers
        self._new_context = new_context
        self._steps = steps
        self._workflows = workflows
        # Each node's output type, per workflow: built once here, read by every handler run.
        self._output_types = {name: wf.output_types() for name, wf in workflows.items()}
        self._backoff = backoff
        self._leases = leases

    @property
    def steps(self) -> Mapping[str, Step[Any, Any]]:
        """The steps it runs handlers of, by kind."""
        return self._steps

    @property
    def database(self) -> Database:
        """Where handlers' completion transactions are opened."""
        return self._database

    @property
    def leases(self) -> LeaseKeeper:
        """The lease keeper told when a handler is over."""
        return self._leases

    @property
    def output_limit(self) -> int:
        """The most bytes an encoded output may take."""
        return self._output_limit

    async def run(self, claimed: Claimed) -> Outcome:
        """Run one attempt; its outcome. Raises only ``CancelledError`` from outside (a task
        cancelled by neither shutdown nor the lease keeper)."""
        step = self._steps[claimed.kind]
        completion = CompletionTx(self._database)
        scope = HandlerScope()
        try:
            ctx, make_input = self._decode(claimed, step, completion, scope)
        except msgspec.DecodeError as exc:  # ValidationError included
            self._leases.finishing(claimed)
            return self.poisoned(claimed, exc)
        except KeyringError as exc:  # sealed with a key this worker lacks: a deploy may add it
            self._leases.finishing(claimed)
            return self.failure(claimed, exc)
        try:
            with self._span(claimed):
                scope.bind()
                try:
                    value = make_input()
                    if step.timeout is None:
                        result = await self._call(claimed, step, ctx, value, scope)
                    else:
                        async with asyncio.timeout(step.timeout):
                            result = await self._call(claimed, step, ctx, value, scope)
                finally:
                    scope.close()
                    # What is left is writing the outcome, which the lease keeper and
                    # hurry() must not cancel (the write itself may delete the task).
                    self._leases.finishing(claimed)
            await ctx.settle_reports()  # the last progress lands before the outcome
            output = codec.encode(
                result,
                step.output_type,
                what=f"output of step {step.name!r}",
                limit=self._output_limit,
            )
            if not isinstance(step, SleepStep):  # a wake time stays plain: SQL reads it
                output = self.sealed(output)
        except Snooze as snooze:
            await completion.rollback()
            return Snoozed(claimed, snooze.delay)
        except _WrongInput as wrong:
            await completion.rollback()
            return self._wrong_input(claimed, wrong.error)
        except asyncio.CancelledError:
            await asyncio.shield(completion.rollback())
            reason = self._leases.reason(claimed)
            if reason == "shutdown" and completion.lost is not None:
                # Its transaction was lost before shutdown came: the attempt failed.
                return self.failure(claimed, lost_completion(completion.lost))
            if reason == "shutdown":
                return HandedBack(claimed)
            if reason == "lost":
                return Lost(claimed)
            logger.info("%s cancelled", claimed, extra=claimed.log_fields())
            raise
        except Exception as exc:
            await completion.rollback()
            timeout = isinstance(exc, TimeoutError) and step.timeout is not None
            return self.failure(claimed, exc, timeout=timeout)
        return Completed(claimed, output, completion if completion.opened else None)

    def _call(
        self,
        claimed: Claimed,
        step: Step[Any, Any],
        ctx: HandlerContext[Any],
        value: Any,
        scope: HandlerScope,
    ) -> Awaitable[Any]:
        if step.is_sync:  # in a thread: see threads.py for what cancelling it means
            return self._threads.run(claimed, scope, functools.partial(step.handler, ctx, value))
        return step.handler(ctx, value)

    def failure(
        self, claimed: Claimed, exc: BaseException, *, timeout: bool = False
    ) -> Retry | Failed:
        """A failed attempt: a retry after the backoff while attempts are left."""
        kind = "Timeout" if timeout else None
        error = error_record(claimed, exc, kind=kind, cipher=self._cipher)
        if timeout:
            what = f"timed out after {self._steps[claimed.kind].timeout:g} s"
        else:
            what = f"failed: {error_type(exc)}: {error_message(exc)}"
        if claimed.attempt < claimed.max_attempts:
            return Retry(claimed, self._backoff(claimed.attempt), error, exc, what)
        return Failed(claimed, error, exc, what, settled=self._settled(claimed))

    def _settled(self, claimed: Claimed) -> bool:
        """Whether ``claimed`` is an item (``map[i]``) of a map node with ``settle=True``,
        whose failure its map node keeps as a value instead of failing the run."""
        if claimed.node is None or not claimed.node.endswith("]"):
            return False
        workflow = self._workflows.get(claimed.run_name)
        node = workflow.get_node(claimed.node.rpartition("[")[0]) if workflow else None
        return node is not None and node.is_map and bool(node.spec and node.spec["map"]["settle"])

    def sealed(self, output: str) -> str:
        """An encoded output as it is stored: sealed with the client's keyring, if any."""
        return sealed(self._cipher, output)

    def opened(self, stored: str) -> str:
        """A stored payload with its sealed values opened (:class:`KeyringError` when this
        worker lacks their key)."""
        return reveal(self._cipher, stored)

    def poisoned(self, claimed: Claimed, exc: Exception) -> Failed:
        """Input stored by an earlier deploy that this code cannot decode: no attempt of it
        can succeed, so the run fails at once rather than after every attempt."""
        error = InvalidInputError(
            f"the stored input of {claimed.kind!r} (run {claimed.run_id}) does not decode as "
            f"the type this code declares: {exc}. It was stored when the type was different: "
            "give new fields defaults and never retype a field (or take the old shape too), "
            "then retry the run (run.retry_all()), or cancel it"
        )
        error.__cause__ = exc
        record = error_record(claimed, error, cipher=self._cipher)
        what = f"failed: InvalidInputError: {error}"
        reason = "no attempt can decode its input"
        return Failed(claimed, record, error, what, reason, settled=self._settled(claimed))

    def _wrong_input(self, claimed: Claimed, error: InvalidInputError) -> Failed:
        """A node whose ``input=`` function builds a value its step does not take: every
        attempt would build it again, so the run fails at once."""
        record = error_record(claimed, error, cipher=self._cipher)
        what = f"failed: InvalidInputError: {error}"
        reason = "its input= function builds the same value every attempt"
        return Failed(claimed, record, error, what, reason, settled=self._settled(claimed))

    def _decode(
        self,
        claimed: Claimed,
        step: Step[Any, Any],
        completion: CompletionTx,
        scope: HandlerScope,
    ) -> tuple[HandlerContext[Any], Callable[[], Any]]:
        """The handler's context, and a function giving its argument: the decoded input, or
        what the node's input function makes of the workflow input and dependency outputs
        (user code, so it runs where the handler does).

        Raises msgspec's errors when a stored payload does not decode as its type, and
        :class:`KeyringError` when it is sealed with a key this worker's client lacks.
        """
        cipher = self._cipher
        outputs: dict[str, Any] = {}
        if claimed.deps is not None:  # each dependency's output is sealed on its own
            outputs = codec.decode(reveal(cipher, claimed.deps), dict[str, msgspec.Raw])
        stored = reveal(cipher, claimed.input)
        workflow = self._workflows.get(claimed.run_name) if claimed.node is not None else None
        node = workflow.get_node(claimed.node) if workflow and claimed.node else None
        output_types = self._output_types[workflow.name] if workflow else None
        ctx = self._new_context(
            claimed,
            outputs=outputs,
            output_types=output_types,
            completion=completion,
            scope=scope,
        )
        if node is not None and node.input_fn is not None:
            assert workflow is not None and output_types is not None
            wf_input = codec.decode(stored, workflow.input_type)
            decoded = {
                name: codec.decode(bytes(raw), output_types.get(name, Any))
                for name, raw in outputs.items()
            }
            input_fn, name = node.input_fn, node.name

            def build() -> Any:
                value = input_fn(wf_input, decoded)
                what = f"the value node {name!r}'s input= function built for step {step.name!r}"
                try:
                    codec.check(value, step.input_type, what=what)
                except InvalidInputError as exc:
                    error = InvalidInputError(
                        f"{exc}: fix the function and deploy it, then retry the run "
                        "(run.retry_all())"
                    )
                    raise _WrongInput(error) from exc
                return value

            return ctx, build
        value = codec.decode(stored, step.input_type)
        return ctx, lambda: value

    def _span(self, claimed: Claimed) -> contextlib.AbstractContextManager[None]:
        observers = self._observers
        if not observers.members:  # the common case: no span, nothing to build for one
            return contextlib.nullcontext()
        carrier = None if claimed.trace is None else codec.decode(claimed.trace, dict[str, str])
        return observers.handler_span(f"run {claimed.kind}", carrier, claimed.span_attributes())

    def report(self, outcome: Outcome, accepted: bool, started: float) -> None:
        """Log the outcome as the database took it, and tell the observers."""
        c = outcome.claimed
        # The common case logs at debug level only: build no log fields for it unless shown.
        if not (accepted and isinstance(outcome, Completed)) or logger.isEnabledFor(logging.DEBUG):
            self._log(outcome, accepted)
        name = outcome.name if accepted else "rejected"
        self._observers.finished(c.kind, c.queue, name, time.perf_counter() - started)

    def _log(self, outcome: Outcome, accepted: bool) -> None:
        c = outcome.claimed
        log = c.log_fields()
        if isinstance(outcome, Completed):
            if accepted:
                logger.debug("%s completed", c, extra=log)
            else:
                logger.warning(
                    "%s returned; completion rejected and rolled back: %s", c, _NOT_OWNED, extra=log
                )
        elif isinstance(outcome, Retry):
            if accepted:
                logger.warning(
                    "%s %s; retrying in %.2f s", c, outcome.what, outcome.delay, extra=log
                )
            else:
                logger.warning("%s %s; not retried: %s", c, outcome.what, _NOT_OWNED, extra=log)
        elif isinstance(outcome, Failed):
            if accepted and outcome.settled:
                logger.warning(
                    "%s %s; %s, and its map node settles it, so the run goes on",
                    c,
                    outcome.what,
                    outcome.reason,
                    extra=log,
                )
            elif accepted:
                logger.error(
                    "%s %s; %s, so the run fails",
                    c,
                    outcome.what,
                    outcome.reason,
                    exc_info=outcome.exc,
                    extra=log,
                )
            else:
                logger.warning(
                    "%s %s; its failure was not recorded: %s",
                    c,
                    outcome.what,
                    _NOT_OWNED,
                    extra=log,
                )
        elif isinstance(outcome, Snoozed):
            if accepted:
                logger.info("%s snoozed for %.3g s", c, outcome.delay, extra=log)
            else:
                logger.warning("%s snoozed; not rescheduled: %s", c, _NOT_OWNED, extra=log)
        elif isinstance(outcome, HandedBack):
            what = "interrupted by shutdown" if outcome.started else "not started yet"
            if accepted:
                logger.info("%s %s; handed back to its queue", c, what, extra=log)
            else:
                logger.info("%s %s; %s", c, what, _NOT_OWNED, extra=log)


class _WrongInput(Exception):
    """A node's ``input=`` function built a value its step does not take: ``error``."""

    def __init__(self, error: InvalidInputError) -> None:
        super().__init__(str(error))
        self.error = error
