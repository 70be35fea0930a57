"""A stopping worker's wait for its running handlers (``Worker.stop``, once its producers
have stopped claiming).

It waits until every attempt is done, the shutdown timeout passes, or ``hurry()`` is called;
then it cancels the handlers still running, which hand their tasks back for any worker to
claim, and tells the completer to give up on outcomes the database does not take within the
same timeout (their leases run out): a stop must end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from cyclone._worker.completer import Completer
from cyclone._worker.leases import LeaseKeeper

logger = logging.getLogger("cyclone")


async def finish_handlers(
    leases: LeaseKeeper,
    completer: Completer,
    *,
    deadline: float,
    hurried: asyncio.Event,
    hurry: Callable[[], None],
    worker_id: str,
) -> None:
    """Let the handlers of ``leases``' attempts finish for up to ``deadline`` seconds, or
    until ``hurried`` is set; then ``hurry()`` (cancel) the rest and wait for their ends."""
    attempts = leases.tasks()
    extra = {"worker": worker_id, "running": len(attempts), "shutdown_timeout": deadline}
    handlers = f"{len(attempts)} handler{'s' * (len(attempts) != 1)}"
    logger.info(
        "worker %s stopping: %s",
        worker_id,
        f"{handlers} running; waiting up to {deadline:g} s for them to finish, then "
        "cancelling the rest"
        if attempts
        else "no handlers running",
        extra=extra,
    )
    if not attempts:
        return
    # Until every attempt is done, the deadline passes, or hurry() is called.
    began = asyncio.get_running_loop().time()
    finished: asyncio.Future[Any] = asyncio.gather(*attempts, return_exceptions=True)
    waiting: asyncio.Future[Any] = asyncio.ensure_future(hurried.wait())
    await asyncio.wait([finished, waiting], timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    left = sum(not a.done() for a in attempts)
    if left:
        when = "when told to stop now" if hurried.is_set() else f"after {deadline:g} s"
        logger.warning(
            "worker %s: %d of %s still running %s; cancelling them, their tasks are "
            "given back for any worker to claim",
            worker_id,
            left,
            handlers,
            when,
            extra=extra,
        )
    else:
        waited = asyncio.get_running_loop().time() - began
        logger.info("worker %s: %s finished in %.1f s", worker_id, handlers, waited, extra=extra)
    hurry()  # cancels the handlers still running; they give their tasks back
    # Outcomes the database does not take in that time are given up on (their leases run
    # out): a stop must end.
    completer.give_up_after(deadline)
    await finished
