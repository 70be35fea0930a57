"""An order service on FastAPI: transactional submission and an in-process worker.

    CYCLONE_DATABASE_URL=postgresql://... uvicorn examples.fastapi_app.app:app

The worker starts in the app's lifespan on the app's own pool. POST /orders needs an
``Idempotency-Key`` header: a retried POST returns the same run and writes one order row.
The dashboard is mounted at /jobs behind HTTP basic auth (user ``admin``, the password in
``DASHBOARD_PASSWORD``), through FastAPI's own security dependency.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import msgspec
from fastapi import FastAPI, Header, HTTPException, Request, Response
from fastapi.security import HTTPBasic

import cyclone
import cyclone.web
from examples.orders import SCHEMA, NewOrder, fulfil, place_order


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with (
        asyncpg.create_pool(os.environ["CYCLONE_DATABASE_URL"], min_size=2, max_size=10) as pool,
        cyclone.Client(pool) as client,
    ):
        await client.migrate()
        await pool.execute(SCHEMA)
        app.state.pool, app.state.client = pool, client
        app.mount("/jobs", cyclone.web.dashboard(client, authorize=is_admin), name="jobs")
        try:
            async with cyclone.Worker(client, workflows=[fulfil], queues={"orders": 8}):
                yield
        finally:  # the dashboard goes with its client (a lifespan may run again, as in tests)
            app.router.routes[:] = [r for r in app.routes if getattr(r, "name", "") != "jobs"]


basic = HTTPBasic()


async def is_admin(request: Request) -> bool:
    """The dashboard's gate: FastAPI's HTTPBasic answers 401 with a challenge when no
    credentials came; wrong ones get a 403."""
    credentials = await basic(request)
    assert credentials is not None  # HTTPBasic raises rather than return None
    password = os.environ.get("DASHBOARD_PASSWORD", "")
    return bool(password) and (
        secrets.compare_digest(credentials.username, "admin")
        & secrets.compare_digest(credentials.password, password)
    )


app = FastAPI(lifespan=lifespan)


@app.post("/orders", status_code=201)
async def create_order(
    request: Request, response: Response, idempotency_key: str = Header()
) -> dict[str, object]:
    try:
        order = msgspec.json.decode(await request.body(), type=NewOrder)
    except msgspec.ValidationError as exc:
        raise HTTPException(422, str(exc)) from exc
    state = request.app.state
    async with state.pool.acquire() as conn:
        try:
            run, created = await place_order(state.client, conn, idempotency_key, order)
        except cyclone.SubmitConflictError as exc:
            raise HTTPException(409, f"key already used for run {exc.run_id}") from exc
        except cyclone.InvalidKeyError as exc:
            raise HTTPException(400, str(exc)) from exc
    if not created:
        response.status_code = 200
    return {"run_id": str(run.id), "created": created}


@app.get("/runs/{run_id}")
async def get_run(run_id: uuid.UUID, request: Request) -> dict[str, object]:
    run: cyclone.ResultRun[str] = cyclone.ResultRun(request.app.state.client, run_id, str)
    try:
        state = await run.status()
    except cyclone.RunNotFoundError as exc:
        raise HTTPException(404, "no such run") from exc
    body: dict[str, object] = {"run_id": str(run_id), "state": state}
    if state is cyclone.RunState.COMPLETED:
        body["result"] = await run.result()
    return body
