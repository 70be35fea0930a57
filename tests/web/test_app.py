"""The dashboard's endpoints through httpx on the ASGI app, against a real database: pages,
filters and their errors, actions through the client API, read-only mode, CSRF, authorize,
escaping of everything the database holds."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Mount

import cyclone
import cyclone.web
from cyclone.testing.plugin import CycloneEnv
from cyclone.web import _live
from tests.web.conftest import Dash, Make, failed_run
from tests.web.flows import FAILING, STEPS, WORKFLOWS, approval, echo, forever

ACTIONS = ["/runs/{id}/retry", "/runs/{id}/cancel", "/runs/{id}/signal", "/runs/bulk"]


def assert_escaped(html: str) -> None:
    assert "<script>document.title" not in html and "<b>bold</b>" not in html
    assert "&lt;script&gt;document.title=" in html and "&lt;b&gt;bold&lt;/b&gt;" in html


async def test_overview_shows_queues_throughput_and_workers(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    await failed_run(cyclone_env)
    await echo.enqueue_many(cyclone_env.client, [1, 2])
    async with make_dash() as dash:
        page = await dash.get("/")
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]
        html = page.text
        for queue in ("web", "payments"):
            assert f'data-queue="{queue}"' in html
        assert "1 completed" in html and "1 failed" in html  # fetch; charge
        assert 'id="no-workers"' in html and "data-worker=" not in html
        live = await dash.get("/overview/live", headers={"HX-Request": "true"})
        assert live.text.startswith('<div id="live"') and "<html" not in live.text
        async with cyclone_env.worker(steps=STEPS, workflows=WORKFLOWS) as worker:
            live = await dash.get("/overview/live", headers={"HX-Request": "true"})
            assert f'data-worker="{worker.id}"' in live.text
            assert 'id="no-workers"' not in live.text


async def test_runs_list_filters_and_pages(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    failed = await failed_run(cyclone_env)
    jobs = await echo.enqueue_many(cyclone_env.client, list(range(5)), queue="other")
    async with make_dash(page_size=2) as dash:
        html = (await dash.get("/runs", params={"state": "failed"})).text
        assert str(failed) in html and str(jobs[0].id) not in html
        html = (await dash.get("/runs", params={"queue": "payments"})).text
        assert re.findall(r'data-run="([^"]+)"', html) == [str(failed)]
        seen: list[str] = []
        page = await dash.get("/runs", params={"name": "web.echo"})
        while True:
            seen += re.findall(r'data-run="([^"]+)"', page.text)
            older = re.search(r'id="older" href="([^"]+)"', page.text)
            if older is None:
                break
            page = await dash.get(older[1].replace("&amp;", "&"))
        assert seen == [str(j.id) for j in reversed(jobs)]
        found = await dash.get("/runs", params={"q": str(failed)})
        assert (found.status_code, found.headers["location"]) == (303, f"/runs/{failed}")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"state": "broken"}, "the state filter &#39;broken&#39; is not a run state: use one of"),
        ({"after": "yesterday"}, "the after filter &#39;yesterday&#39; is not a date and time"),
        (
            {"after": "2025-02-01T00:00", "before": "2025-01-01T00:00"},
            "the after filter must be earlier than the before filter",
        ),
        ({"cursor": "nope"}, "is not one this page made: follow the page links"),
        ({"name": "x" * 300}, "the name filter is longer than 256 characters"),
        ({"q": "<b>not-an-id</b>"}, "&#39;&lt;b&gt;not-an-id&lt;/b&gt;&#39; is not a run id"),
    ],
)
async def test_bad_filters_are_a_400_that_says_why(
    make_dash: Make, params: dict[str, str], message: str
) -> None:
    async with make_dash() as dash:
        for path in ("/runs",) if "q" in params else ("/runs", "/runs/live"):
            response = await dash.get(path, params=params)
            assert response.status_code == 400, path
            assert message in response.text, response.text


async def test_unknown_run_is_a_404(make_dash: Make) -> None:
    async with make_dash() as dash:
        for path in (f"/runs/{uuid.uuid4()}", f"/runs/{uuid.uuid4()}/live", "/runs/not-a-uuid"):
            response = await dash.get(path)
            assert response.status_code == 404, path
        missing = await dash.get("/runs", params={"q": str(uuid.uuid4())})
        assert missing.status_code == 404 and "not found" in missing.text
        assert (await dash.get("/nowhere")).status_code == 404


async def test_run_page_shows_nodes_traceback_dag_and_payloads_escaped(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    run_id = await failed_run(cyclone_env)
    async with make_dash() as dash:
        page = await dash.get(f"/runs/{run_id}")
        html = page.text
        assert page.status_code == 200
        assert 'id="run-state">failed<' in html
        assert 'class="node failed" data-node="web.charge"' in html  # the DAG, coloured
        assert 'class="node completed" data-node="web.fetch"' in html
        assert html.count('class="edge"') == 2
        assert "Traceback (most recent call last)" in html and "ValueError" in html
        assert 'id="retry-all"' in html and 'id="cancel"' in html
        assert_escaped(html)  # the input's note and the error message
    async with make_dash() as dash:  # and in the runs list
        assert_escaped((await dash.get("/runs")).text)


async def test_retry_all_goes_through_the_api(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run_id = await failed_run(cyclone_env)
    async with make_dash() as dash:
        await dash.get(f"/runs/{run_id}")
        node = await dash.post(f"/runs/{run_id}/retry", {"node": "<i>nope</i>"})
        assert (
            node.status_code == 409 and "has no node &#39;&lt;i&gt;nope&lt;/i&gt;&#39;" in node.text
        )
        FAILING["charge"] = False
        done = await dash.post(f"/runs/{run_id}/retry", {}, headers={"HX-Request": "true"})
        assert done.status_code == 200
        assert done.text.startswith('<div id="live"') and "Failed nodes reset" in done.text
        await cyclone_env.drain(steps=STEPS, workflows=WORKFLOWS)
        run = cyclone.Run(cyclone_env.client, run_id)
        assert await run.status() is cyclone.RunState.COMPLETED
        # The API refuses a retry of a run that has not failed; so does the page.
        again = await dash.post(f"/runs/{run_id}/retry", {})
        assert again.status_code == 409
        assert "Not retried:" in again.text and "only a failed run can be retried" in again.text


async def test_retry_one_node_cancel_and_signal(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    failed = await failed_run(cyclone_env)
    waiting = await approval.submit(cyclone_env.client, {"id": 2})
    running = await forever.enqueue(cyclone_env.client, None)
    async with make_dash() as dash:
        page = (await dash.get(f"/runs/{waiting.id}")).text
        assert '<option value="approve">approve</option>' in page
        bad = await dash.post(f"/runs/{waiting.id}/signal", {"node": "approve", "payload": "{"})
        assert bad.status_code == 400 and "the payload is not JSON" in bad.text
        ok = await dash.post(
            f"/runs/{waiting.id}/signal", {"node": "approve", "payload": '{"by": "<i>ops</i>"}'}
        )
        assert ok.status_code == 200 and "Signalled" in ok.text
        assert (await waiting.payloads()).nodes["approve"].signal == {"by": "<i>ops</i>"}
        FAILING["charge"] = False
        reset = await dash.post(f"/runs/{failed}/retry", {"node": "web.charge"})
        assert reset.status_code == 200 and "Node &#39;web.charge&#39; reset" in reset.text
        cancelled = await dash.post(f"/runs/{running.id}/cancel", {})
        assert cancelled.status_code == 200 and "Run cancelled." in cancelled.text
        assert await running.status() is cyclone.RunState.CANCELLED
        twice = await dash.post(f"/runs/{running.id}/cancel", {})
        assert twice.status_code == 409 and "already completed or been cancelled" in twice.text


async def test_bulk_actions_confirm_the_count_and_act_on_those_runs(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    failed = [await failed_run(cyclone_env, {"id": i}) for i in range(3)]
    done = await echo.enqueue(cyclone_env.client, 1)
    await cyclone_env.drain(steps=STEPS)
    async with make_dash() as dash:
        confirm = await dash.get(
            "/runs/bulk", params={"action": "retry", "scope": "filter", "state": "failed"}
        )
        assert 'id="bulk-count">Retry 3 runs?<' in confirm.text
        ids = re.findall(r'name="id" value="([^"]+)"', confirm.text)
        assert sorted(ids) == sorted(str(f) for f in failed)
        FAILING["charge"] = False
        result = await dash.post("/runs/bulk", {"action": "retry", "id": [*ids, str(done.id)]})
        assert 'id="bulk-result">Retried 3 runs<' in result.text
        assert "Refused (1)" in result.text  # the completed job: the API refuses its retry
        nothing = await dash.get("/runs/bulk", params={"action": "cancel", "scope": "selected"})
        assert nothing.status_code == 400 and "no runs selected" in nothing.text
        too_many = [str(uuid.uuid4()) for _ in range(1_001)]
        over = await dash.post("/runs/bulk", {"action": "cancel", "id": too_many})
        assert over.status_code == 400 and "at most 1000 runs" in over.text
        odd = await dash.get("/runs/bulk", params={"action": "delete", "scope": "filter"})
        assert odd.status_code == 400 and "use retry or cancel" in odd.text


async def test_actions_need_the_csrf_token(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run_id = await failed_run(cyclone_env)
    async with make_dash() as dash:
        await dash.get(f"/runs/{run_id}")
        for path in ACTIONS:
            url = path.format(id=run_id)
            missing = await dash.http.post(url, data={"action": "cancel", "id": str(run_id)})
            assert missing.status_code == 403, url
            assert "missing or wrong CSRF token" in missing.text
            wrong = await dash.http.post(url, data={"csrf": "0" * 64, "id": str(run_id)})
            assert wrong.status_code == 403, url
        dash.http.cookies.clear()  # a token without its cookie: another browser's
        stolen = await dash.post(f"/runs/{run_id}/cancel", {})
        assert stolen.status_code == 403
    assert await cyclone.Run(cyclone_env.client, run_id).status() is cyclone.RunState.FAILED


@pytest.mark.parametrize(
    ("host", "options"),
    [("127.0.0.1", {"read_only": True}), ("10.1.2.3", {}), ("dashboard.example", {})],
)
async def test_read_only_serves_no_actions(
    cyclone_env: CycloneEnv, make_dash: Make, host: str, options: dict[str, bool]
) -> None:
    run_id = await failed_run(cyclone_env)
    async with make_dash(host, **options) as dash:
        page = await dash.get(f"/runs/{run_id}")
        assert page.status_code == 200 and "read-only" in page.text
        assert 'id="retry-all"' not in page.text and 'name="id"' not in page.text
        for path in ACTIONS:
            response = await dash.post(path.format(id=run_id), {"action": "retry"})
            assert response.status_code in (404, 405), path
        confirm = await dash.get("/runs/bulk", params={"action": "retry", "scope": "filter"})
        assert confirm.status_code == 404
    assert await cyclone.Run(cyclone_env.client, run_id).status() is cyclone.RunState.FAILED


async def test_a_proxied_loopback_request_is_read_only(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    run_id = await failed_run(cyclone_env)
    async with make_dash() as dash:
        await dash.get(f"/runs/{run_id}")
        proxied = await dash.post(
            f"/runs/{run_id}/cancel", {}, headers={"X-Forwarded-For": "203.0.113.9"}
        )
        assert proxied.status_code == 404


async def test_authorize_hook(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run_id = await failed_run(cyclone_env)

    async def admins(request: Request) -> bool:
        return request.headers.get("x-user") == "admin"

    def basic(request: Request) -> bool:
        if "authorization" not in request.headers:
            raise HTTPException(401, "log in", headers={"WWW-Authenticate": "Basic"})
        return True

    async with make_dash("10.1.2.3", authorize=admins) as dash:
        denied = await dash.get("/")
        assert denied.status_code == 403 and "not authorized" in denied.text
        admin = {"x-user": "admin"}
        page = await dash.get(f"/runs/{run_id}", headers=admin)
        assert 'id="cancel"' in page.text  # authorize given: actions on, even off loopback
        done = await dash.post(f"/runs/{run_id}/cancel", {}, headers=admin)
        assert done.status_code == 200
        assert (await dash.post(f"/runs/{run_id}/cancel", {})).status_code == 403
    async with make_dash(authorize=basic) as dash:
        challenge = await dash.get("/runs")
        assert challenge.status_code == 401 and challenge.headers["www-authenticate"] == "Basic"
        assert (await dash.get("/runs", headers={"Authorization": "Basic eDp5"})).status_code == 200


async def test_mounted_under_a_prefix(cyclone_env: CycloneEnv) -> None:
    import httpx

    run_id = await failed_run(cyclone_env)
    app = Starlette(routes=[Mount("/jobs", cyclone.web.dashboard(cyclone_env.client))])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        dash = Dash(http)
        page = await dash.get(f"/jobs/runs/{run_id}")
        assert page.status_code == 200
        assert f'action="/jobs/runs/{run_id}/cancel"' in page.text
        assert 'href="/jobs/static/dashboard.css"' in page.text
        assert "Path=/jobs/" in page.headers["set-cookie"]
        static = await http.get("/jobs/static/htmx.min.js")
        assert static.status_code == 200 and "Zero-Clause BSD" in static.text
        assert (await dash.post(f"/jobs/runs/{run_id}/cancel", {})).status_code == 200


async def test_events_stream_a_change_when_work_arrives(cyclone_env: CycloneEnv) -> None:
    stream = _live.changes(cyclone_env.client, lifetime=60)
    assert await anext(stream) == "retry: 2000\n\n"
    # The listener's first connect counts as a change (notifications may have been missed).
    assert await asyncio.wait_for(anext(stream), 30) == "event: change\ndata: {}\n\n"
    pending = asyncio.ensure_future(anext(stream))
    await echo.enqueue(cyclone_env.client, 1)
    assert await asyncio.wait_for(pending, 30) == "event: change\ndata: {}\n\n"
    await stream.aclose()


def test_options_are_checked(cyclone_env: CycloneEnv) -> None:
    with pytest.raises(TypeError, match=r"needs a cyclone\.Client"):
        cyclone.web.dashboard(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 16 bytes"):
        cyclone.web.dashboard(cyclone_env.client, secret="short")
    with pytest.raises(ValueError, match="page_size must be"):
        cyclone.web.dashboard(cyclone_env.client, page_size=0)
