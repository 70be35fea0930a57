"""The order service on aiohttp: the same shape as the FastAPI example.

    CYCLONE_DATABASE_URL=postgresql://... python -m examples.aiohttp_app.app

The pool, client and worker start in ``on_startup`` and stop in ``on_cleanup``.
"""

from __future__ import annotations

import os
import uuid

import asyncpg
import msgspec
from aiohttp import web

import cyclone
from examples.orders import SCHEMA, NewOrder, fulfil, place_order

POOL = web.AppKey("pool", asyncpg.Pool)
CLIENT = web.AppKey("client", cyclone.Client)
WORKER = web.AppKey("worker", cyclone.Worker)


async def start(app: web.Application) -> None:
    pool = await asyncpg.create_pool(os.environ["CYCLONE_DATABASE_URL"], min_size=2, max_size=10)
    client = cyclone.Client(pool)
    await client.migrate()
    await pool.execute(SCHEMA)
    worker = cyclone.Worker(client, workflows=[fulfil], queues={"orders": 8})
    await worker.start()
    app[POOL], app[CLIENT], app[WORKER] = pool, client, worker


async def stop(app: web.Application) -> None:
    await app[WORKER].stop()
    await app[CLIENT].aclose()  # sends wakeups still held, before the pool closes
    await app[POOL].close()


def fail(error: type[web.HTTPException], detail: str) -> web.HTTPException:
    """An HTTP error with a JSON body, as FastAPI gives."""
    return error(
        text=msgspec.json.encode({"detail": detail}).decode(), content_type="application/json"
    )


async def create_order(request: web.Request) -> web.Response:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        raise fail(web.HTTPBadRequest, "an Idempotency-Key header is required")
    try:
        order = msgspec.json.decode(await request.read(), type=NewOrder)
    except msgspec.ValidationError as exc:
        raise fail(web.HTTPUnprocessableEntity, str(exc)) from exc
    async with request.app[POOL].acquire() as conn:
        try:
            run, created = await place_order(request.app[CLIENT], conn, key, order)
        except cyclone.SubmitConflictError as exc:
            raise fail(web.HTTPConflict, f"key already used for run {exc.run_id}") from exc
        except cyclone.InvalidKeyError as exc:
            raise fail(web.HTTPBadRequest, str(exc)) from exc
    return web.json_response(
        {"run_id": str(run.id), "created": created}, status=201 if created else 200
    )


async def get_run(request: web.Request) -> web.Response:
    try:
        run_id = uuid.UUID(request.match_info["run_id"])
    except ValueError as exc:
        raise fail(web.HTTPNotFound, "no such run") from exc
    run: cyclone.ResultRun[str] = cyclone.ResultRun(request.app[CLIENT], run_id, str)
    try:
        state = await run.status()
    except cyclone.RunNotFoundError as exc:
        raise fail(web.HTTPNotFound, "no such run") from exc
    body: dict[str, object] = {"run_id": str(run_id), "state": state.value}
    if state is cyclone.RunState.COMPLETED:
        body["result"] = await run.result()
    return web.json_response(body)


def make_app() -> web.Application:
    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/orders", create_order)
    app.router.add_get("/runs/{run_id}", get_run)
    return app


if __name__ == "__main__":
    web.run_app(make_app())
