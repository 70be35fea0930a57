"""Handler contexts for unit tests: run a handler as a plain coroutine, no worker, no database."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cyclone._client import Client, Context
from cyclone.testing._recorder import StreamRecorder, TxRecorder


def new_context(
    *,
    completion_tx: TxRecorder | None = None,
    outputs: Mapping[str, Any] | None = None,
    attempt: int = 1,
    max_attempts: int = 1,
    run_id: uuid.UUID | None = None,
    node: str | None = None,
    kind: str = "test",
    queue: str = "default",
    client: Client | None = None,
    stream: StreamRecorder | None = None,
) -> Context:
    """A :class:`cyclone.Context` for calling a handler directly in a unit test.

    ``outputs`` are the dependency outputs ``ctx.output(name)`` returns, as plain values.
    Give a :class:`TxRecorder` as ``completion_tx`` to see what the handler wrote and
    enqueued in its completion transaction; without one, ``ctx.completion_tx()`` raises
    :class:`cyclone.ContextError`. ``client`` may stay None when the handler only enqueues
    through the recorder. Give a :class:`StreamRecorder` as ``stream`` to see what the
    handler streamed and reported; without one, ``ctx.stream()`` and ``ctx.report()`` raise
    :class:`cyclone.ContextError`.
    """
    run = _TestAttempt(run_id or uuid.uuid4(), node, kind, attempt, max_attempts, queue)
    return Context(
        client,  # type: ignore[arg-type]
        run,
        outputs=dict(outputs or {}),
        completion=completion_tx,
        streams=stream,
    )


@dataclass(frozen=True)
class _TestAttempt:
    """The attempt a test's context stands for."""

    run_id: uuid.UUID
    node: str | None
    kind: str
    attempt: int
    max_attempts: int
    queue: str
