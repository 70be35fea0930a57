"""Batch steps in the worker: claimed jobs of a batch kind gather into batches, and each
batch's handler runs once for all of them (``batchcall.py``).

Every item is an ordinary attempt: claimed by its queue's claims (so flow control counts
items), holding its own slot and lease from claim until its outcome is written. Instead of
running a handler, an item joins the collector of its (kind, queue, group), and waits::

    waiting in a collector --(max_size items, max_wait since the first item, or its
       |                      queue's slots all held by waiting items)--> in a running batch
       |                                                                      |
       +--(worker stops: handed back, attempt refunded)                       +--> its own
       +--(task lost, or run cancelled: leaves the collector, nothing written)     outcome

The third trigger is "no more items can come": a queue whose concurrency is below
``max_size`` would otherwise always wait ``max_wait``. An item whose task is lost while its
batch runs (its run cancelled, its lease taken over) ends at once as lost; the handler goes
on for the others, and the batch's shared completion transaction, if it opened one, is
rolled back (the handler's writes for the lost item are in it). Shutdown cancelling a
running batch (a second Ctrl-C, the shutdown deadline) cancels its handler and hands every
item back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from cyclone._model import codec
from cyclone._model.batches import BatchStep, HandlerBatchContext
from cyclone._model.errors import KeyringError
from cyclone._worker.batchcall import BatchCall, Item, Result
from cyclone._worker.completer import Completer
from cyclone._worker.executor import Executor
from cyclone._worker.leases import LeaseKeeper
from cyclone._worker.outcomes import Claimed, HandedBack, Lost

logger = logging.getLogger("cyclone")

Key = tuple[str, str, Hashable]  # kind, queue, group


@dataclass(eq=False, slots=True)
class _Collector:
    """The items of one (kind, queue, group) waiting for their batch."""

    step: BatchStep[Any, Any]
    key: Key
    items: list[Item] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Batches:
    """Gathers the items of the batch kinds ``steps`` of one worker into batches and has
    ``call`` run them; ``executor`` says what an item that cannot join becomes."""

    def __init__(
        self,
        steps: Mapping[str, BatchStep[Any, Any]],
        *,
        call: BatchCall,
        executor: Executor,
        leases: LeaseKeeper,
    ) -> None:
        self._steps = steps
        self._call = call
        self._executor = executor
        self._leases = leases
        self._collectors: dict[Key, _Collector] = {}
        self._waiting: dict[str, int] = {}  # items in collectors, by queue
        self._running: set[asyncio.Task[None]] = set()
        self._stopping = False

    @classmethod
    def serving(
        cls,
        executor: Executor,
        completer: Completer,
        new_context: Callable[..., HandlerBatchContext[Any]],
    ) -> Batches | None:
        """The batches of the batch steps among ``executor``'s (None: it has none), their
        contexts made by ``new_context`` and their shared completions committed by
        ``completer``."""
        kinds = {n: s for n, s in executor.steps.items() if isinstance(s, BatchStep)}
        if not kinds:
            return None
        call = BatchCall(
            executor.database,
            executor=executor,
            completer=completer,
            leases=executor.leases,
            new_context=new_context,
            output_limit=executor.output_limit,
        )
        return cls(kinds, call=call, executor=executor, leases=executor.leases)

    def serves(self, kind: str) -> bool:
        """Whether ``kind`` is a batch kind of this worker."""
        return kind in self._steps

    async def run(self, claimed: Claimed, slots: int) -> Result:
        """One item's part: join a batch, wait for it, and give the item's outcome (and
        whether it was written already: True or False; None if still to write). ``slots``
        is the concurrency of the item's queue."""
        step = self._steps[claimed.kind]
        try:
            value = codec.decode(self._executor.opened(claimed.input), step.input_type)
            group = None if step.group_by is None else step.group_by(value)
            hash(group)
        except msgspec.DecodeError as exc:
            self._leases.finishing(claimed)
            return self._executor.poisoned(claimed, exc), None
        except KeyringError as exc:  # sealed with a key this worker lacks: a deploy may add it
            self._leases.finishing(claimed)
            return self._executor.failure(claimed, exc), None
        except Exception as exc:  # group_by is user code: the item fails, as a handler would
            self._leases.finishing(claimed)
            return self._executor.failure(claimed, exc), None
        if self._stopping and self._leases.mark(claimed, "shutdown"):
            # Claimed as the worker stopped (a claim in flight): no batch starts now.
            self._leases.finishing(claimed)
            return HandedBack(claimed, started=False), None
        item = Item(claimed, value, asyncio.get_running_loop().create_future())
        self._join(step, (claimed.kind, claimed.queue, group), item, slots)
        try:
            result = await item.result
        except asyncio.CancelledError:
            handed = await self._cancelled(item)
            if handed is None:
                raise
            return handed
        self._leases.finishing(claimed)
        return result

    def stop(self) -> None:
        """Hand back every item still waiting in a collector, and every item claimed from
        now on (the worker is stopping)."""
        self._stopping = True
        for collector in list(self._collectors.values()):
            self._forget(collector)
            for item in collector.items:
                if self._leases.mark(item.claimed, "shutdown") and not item.result.done():
                    item.result.set_result((HandedBack(item.claimed, started=False), None))

    def _join(self, step: BatchStep[Any, Any], key: Key, item: Item, slots: int) -> None:
        collector = self._collectors.get(key)
        if collector is None:
            collector = self._collectors[key] = _Collector(step, key)
            loop = asyncio.get_running_loop()
            collector.timer = loop.call_later(step.max_wait, self._flush, collector, "wait")
        collector.items.append(item)
        queue = key[1]
        self._waiting[queue] = self._waiting.get(queue, 0) + 1
        if len(collector.items) >= step.max_size:
            self._flush(collector, "size")
        elif self._waiting[queue] >= slots:
            # No more items can come: every slot of the queue holds a waiting item.
            for other in [c for c in self._collectors.values() if c.key[1] == queue]:
                self._flush(other, "slots")

    def _forget(self, collector: _Collector) -> None:
        if self._collectors.get(collector.key) is collector:
            del self._collectors[collector.key]
            self._waiting[collector.key[1]] -= len(collector.items)
        if collector.timer is not None:
            collector.timer.cancel()
            collector.timer = None

    def _flush(self, collector: _Collector, why: str) -> None:
        """Start the batch of a collector's items."""
        if self._collectors.get(collector.key) is not collector:
            return  # flushed already
        self._forget(collector)
        items = [i for i in collector.items if not i.result.done()]
        if not items:
            return
        kind, queue, group = collector.key
        logger.debug(
            "batch of %d items of %s (group %r) starts: %s",
            len(items),
            kind,
            group,
            {"size": "max_size reached", "wait": "max_wait passed"}.get(
                why, "every slot of its queue holds an item"
            ),
            extra={"kind": kind, "queue": queue, "count": len(items)},
        )
        task = asyncio.get_running_loop().create_task(
            self._call(collector.step, queue, group, items), name=f"cyclone-batch-{kind}"
        )
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        for item in items:
            item.batch = task

    async def _cancelled(self, item: Item) -> Result | None:
        """The item's own task was cancelled: by the lease keeper (its task lost), by
        shutdown, or from outside (None: the cancellation goes on)."""
        claimed = item.claimed
        reason = self._leases.reason(claimed)
        batch = item.batch
        if batch is None:  # still waiting: leave the collector
            for collector in self._collectors.values():
                if item in collector.items:
                    collector.items.remove(item)
                    self._waiting[collector.key[1]] -= 1
                    if not collector.items:
                        self._forget(collector)
                    break
        item.gone = True
        if reason == "lost":
            return Lost(claimed), None
        if batch is not None and reason in ("shutdown", None):
            # The handler runs for the batch: stop it before the task goes back, so that
            # nothing of it runs on while another worker takes the task.
            batch.cancel()
            await asyncio.shield(asyncio.wait([batch]))
        if reason == "shutdown":
            self._leases.finishing(claimed)
            return HandedBack(claimed, started=batch is not None), None
        return None
