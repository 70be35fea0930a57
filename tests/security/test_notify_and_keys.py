"""The NOTIFY payload format cannot be forged through a queue name, and the key rules hold at
every entry point that takes a key."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cyclone
from cyclone._model.options import _QUEUE
from cyclone._services.notifier import (
    QUEUE_PREFIX,
    RUN_PREFIX,
    Notifier,
    queue_payload,
    run_payloads,
)
from cyclone.testing import TxRecorder, new_context
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows, recording_queries

queue_names = st.from_regex(_QUEUE, fullmatch=True)


@given(queue=queue_names, run_id=st.uuids())
def test_a_queue_payload_only_ever_wakes_its_queue(queue: str, run_id: uuid.UUID) -> None:
    # The prefix is written first, whatever the queue is, so no queue name can make a payload
    # that starts like a run notification; and queue names have no ",", the run ids' separator.
    for name in (queue, f"{RUN_PREFIX}{run_id}"):
        notifier = Notifier(None, "cyclone_public")  # type: ignore[arg-type]  # never connects
        woken: list[str] = []
        notifier.subscribe_queues(woken.append)
        event = notifier.watch_run(run_id)
        payload = queue_payload(name)
        assert payload.startswith(QUEUE_PREFIX) and len(payload.encode()) < 8000
        notifier._dispatch(payload)
        assert (woken, event.is_set()) == ([name], False)


@cyclone.step("sec.notified", queue="sec_notify")
async def notified(ctx: cyclone.Context, n: int) -> int:
    return n


async def test_a_queue_named_like_a_run_payload_does_not_end_that_run(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    run = await notified.enqueue(client, 1)
    forged = f"{RUN_PREFIX}{run.id}"  # a valid queue name: letters, digits, ':' and '-'
    notifier = client.services.notifier
    assert notifier is not None
    woken: list[str] = []
    arrived = asyncio.Event()

    def on_queue(queue: str) -> None:
        woken.append(queue)
        arrived.set()

    unsubscribe = notifier.subscribe_queues(on_queue)
    notifier.acquire()
    await asyncio.wait_for(notifier.connected.wait(), 30)
    ended = notifier.watch_run(run.id)  # after the connect, which wakes every waiter once
    try:
        await notified.enqueue(client, 2, queue=forged)  # sends NOTIFY "q:r:<run id>"
        async with asyncio.timeout(30):
            while forged not in woken:
                arrived.clear()
                await arrived.wait()
        assert not ended.is_set()
        await client.services.publisher.send(run_payloads([run.id]))  # the genuine one does
        await asyncio.wait_for(ended.wait(), 30)
    finally:
        notifier.unwatch_run(run.id, ended)
        unsubscribe()
        await notifier.release()


BAD_KEYS = ["", "a\x00b", "lone \udc80", "k" * 257]

keyed_flow = cyclone.define("sec.keyed", int)
keyed_flow.node(notified)


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_the_key_rules_hold_at_every_entry_point(cyclone_env: CycloneEnv, key: str) -> None:
    client = cyclone_env.client
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: notified.enqueue(client, 1, unique=key),
        lambda: notified.enqueue(client, 1, sequence=key),
        lambda: notified.enqueue_many(client, [1, 2], sequence=key),
        lambda: keyed_flow.submit_once(client, key, 1),
        lambda: cyclone.enqueue(client, notified, 1, unique=key),
    ]
    for call in calls:
        with pytest.raises(cyclone.InvalidKeyError):
            await call()
    async with (
        cyclone_env.pool.acquire() as conn,
        recording_queries(conn) as sent,
        conn.transaction(),
    ):
        with pytest.raises(cyclone.InvalidKeyError):
            await notified.enqueue_many_tx(client, conn, [1], sequence=key)
        with pytest.raises(cyclone.InvalidKeyError):
            await keyed_flow.submit_once_tx(client, conn, key, 1)
    assert sent == []
    recorder = TxRecorder()
    ctx = new_context(completion_tx=recorder, client=client)
    with pytest.raises(cyclone.InvalidKeyError):
        await cyclone.enqueue_completion(ctx, client, notified, 1, unique=key)
    assert recorder.enqueued == []
    assert await count_rows(cyclone_env, "cyclone_runs") == 0
