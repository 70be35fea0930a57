"""The dashboard's endpoints through httpx on the ASGI app, against a real database: pages,
filters and their errors, actions through the client API, read-only mode, CSRF, authorize,
escaping of everything the database holds."""

from __future__ import annotations

import asyncio
import html as markup
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
from tests.conftest import released_by_a_peer
from tests.web.conftest import Dash, Make, failed_run
from tests.web.flows import (
    FAILING,
    STEPS,
    WORKFLOWS,
    approval,
    echo,
    forever,
    parented,
    pipeline,
    shaped,
)

ACTIONS = [
    "/runs/{id}/retry",
    "/runs/{id}/cancel",
    "/runs/{id}/signal",
    "/runs/{id}/fork",
    "/runs/bulk",
]


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
        assert 'id="retry-all"' in html
        assert_escaped(html)  # the input's note and the error message
    async with make_dash() as dash:  # and in the runs list
        assert_escaped((await dash.get("/runs")).text)


async def test_run_page_says_who_released_an_attempt(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    run = await echo.enqueue(cyclone_env.client, "x")
    await released_by_a_peer(cyclone_env, run)
    async with make_dash() as dash:
        html = (await dash.get(f"/runs/{run.id}")).text
    [evidence] = re.findall(r'<p class="released">([^<]*)</p>', html)
    assert evidence.startswith("worker lost: released by peer-1 at ")
    assert "worker gone-1 (host h, pid 1)" in evidence


async def test_run_page_draws_a_map_as_one_box_with_its_counts(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    run = await shaped.submit(cyclone_env.client, ["yes", "a", "b"])
    async with make_dash() as dash:
        html = (await dash.get(f"/runs/{run.id}")).text
        # Before any worker: no item done, two of three queued (max_parallel=2).
        assert 'class="node waiting map" data-node="each" data-items="0/3"' in html
        await cyclone_env.drain(steps=STEPS, workflows=WORKFLOWS)
        html = (await dash.get(f"/runs/{run.id}")).text
    graph = html[html.index('<svg class="dag"') : html.index("</svg>")]
    assert 'class="node completed map" data-node="each" data-items="3/3"' in graph
    assert ">each 3/3<" in graph
    assert "each[0]" not in graph  # the items are in the box, not boxes of their own
    assert 'class="node skipped" data-node="never"' in graph
    assert graph.count('class="edge"') == 1  # gate to never
    table = html[html.index('<table class="nodes">') :]
    rows = re.findall(r'<tr class="node-row( item)?" data-node="([^"]+)"', table)
    assert rows == [
        ("", "each"),
        (" item", "each[0]"),
        (" item", "each[1]"),
        (" item", "each[2]"),
        ("", "gate"),
        ("", "never"),
    ]


async def test_a_child_run_and_its_parent_link_to_each_other(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    run = await parented.submit(cyclone_env.client, {"n": 1})
    await cyclone_env.drain(steps=STEPS, workflows=WORKFLOWS)
    kid = (await run.info()).nodes[0].child_run
    assert kid is not None
    async with make_dash() as dash:
        html = (await dash.get(f"/runs/{run.id}")).text
        assert f'<a class="child-link" href="/runs/{kid}">' in html  # the box in the graph
        assert f'<a class="child-run" href="/runs/{kid}"' in html  # the node's row
        child_page = (await dash.get(f"/runs/{kid}")).text
    assert f'<a id="parent-run" href="/runs/{run.id}">{run.id}</a>, node k' in child_page


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
        assert odd.status_code == 400 and "use retry, cancel or fork" in odd.text


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
        assert 'id="retry-all"' in page.text  # authorize given: actions on, even off loopback
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
        assert f'action="/jobs/runs/{run_id}/retry"' in page.text
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


def actions_of(html: str) -> set[str]:
    """The run actions a page offers: retry-all, cancel, retry-node:<node> and fork:<node>
    per node."""
    found = set(re.findall(r'id="(retry-all|cancel|signal)"', html))
    found |= {f"retry-node:{n}" for n in re.findall(r'name="node" value="([^"]+)"', html)}
    found |= {f"fork:{n}" for n in re.findall(r'name="from_node" value="([^"]+)"', html)}
    return found


async def test_actions_show_only_where_they_apply(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    client = cyclone_env.client
    failed = await failed_run(cyclone_env)
    given_up = await failed_run(cyclone_env, {"id": 2})  # failed, then cancelled
    await cyclone.Run(client, given_up).cancel()
    completed = await echo.enqueue(client, 1)
    await cyclone_env.drain(steps=STEPS)
    pending = await forever.enqueue(client, None)  # no worker: it stays pending
    cancelled = await forever.enqueue(client, None)
    await cancelled.cancel()
    waiting = await approval.submit(client, {"id": 3})
    async with make_dash() as dash:
        offered = {
            name: actions_of((await dash.get(f"/runs/{run_id}")).text)
            for name, run_id in [
                ("failed", failed),
                ("completed", completed.id),
                ("pending", pending.id),
                ("cancelled", cancelled.id),
                ("given up", given_up),
                ("waiting", waiting.id),
            ]
        }
        forks = {"fork:web.fetch", "fork:web.charge", "fork:web.ship"}  # an ended workflow's
        assert offered == {
            "failed": {"retry-all", "retry-node:web.charge", *forks},
            "completed": set(),  # a job: it does not fork
            "pending": {"cancel"},
            "cancelled": set(),
            "given up": forks,  # its node stays failed, but the run takes no retry
            "waiting": {"cancel", "signal"},
        }
        # What the page hides, the endpoints still refuse, with the API's words.
        for run_id in (completed.id, given_up):
            retry = await dash.post(f"/runs/{run_id}/retry", {})
            assert retry.status_code == 409
            assert "Not retried:" in retry.text and "only a failed run can be retried" in retry.text
            cancel = await dash.post(f"/runs/{run_id}/cancel", {})
            assert cancel.status_code == 409
            assert "already completed or been cancelled" in cancel.text
        node = await dash.post(f"/runs/{given_up}/retry", {"node": "web.charge"})
        assert node.status_code == 409 and "only a failed run can be retried" in node.text
        retry = await dash.post(f"/runs/{pending.id}/retry", {})
        assert retry.status_code == 409 and "only a failed run can be retried" in retry.text
    assert await completed.status() is cyclone.RunState.COMPLETED
    assert await cyclone.Run(client, given_up).status() is cyclone.RunState.CANCELLED


RECENT = r"(just now|\d+ s ago)"
"""A relative time of a moment ago (the machine may be slow)."""


def section(html: str, css_id: str) -> str:
    found = re.search(rf'<section class="[^"]*" id="{css_id}">(.*?)</section>', html, re.S)
    assert found, css_id
    return found[1]


def text(fragment: str) -> str:
    """A fragment's text as a reader sees it: tags gone, entities decoded, spaces folded."""
    return " ".join(markup.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


async def test_failure_summary_is_readable(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run_id = await failed_run(cyclone_env)
    async with make_dash() as dash:
        html = (await dash.get(f"/runs/{run_id}")).text
    summary = section(html, "run-error")
    assert re.fullmatch(
        re.escape(
            'Why it failed ValueError: card declined <script>document.title="pwned"</script>'
            "<b>bold</b> Node web.charge, attempt 1, "
        )
        + rf"{RECENT}, after [0-9.]+ m?s\. Traceback below",
        text(summary),
    ), text(summary)
    assert "traceback" not in summary.lower().replace("traceback below", "")  # no JSON dump
    assert html.count("Traceback (most recent call last)") == 1  # under its node, once
    anchor = re.search(r'<a href="#([^"]+)">Traceback below</a>', summary)
    assert anchor and f'<details class="attempt" id="{anchor[1]}" open>' in html
    # Times read as times: no microseconds, the full time on hover.
    assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}", html)
    assert re.search(rf'<time datetime="[-0-9T:.]+Z" title="[-0-9 :]+ UTC">{RECENT}</time>', html)
    assert re.search(
        r"Finished</dt><dd>[-0-9 :]+ UTC <span class=\"muted\">· took [0-9.]+ m?s<", html
    )


async def test_attempts_show_their_duration(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run_id = await failed_run(cyclone_env)
    # An error record that says when its attempt started gives the attempt's duration.
    await cyclone_env.pool.execute(
        "UPDATE cyclone_steps SET errors = jsonb_set(errors, '{0,started_at}',"
        " to_jsonb((errors->0->>'at')::timestamptz - interval '83 seconds'))"
        " WHERE run_id = $1 AND node = 'web.charge'",
        run_id,
    )
    async with make_dash() as dash:
        html = (await dash.get(f"/runs/{run_id}")).text
    attempt = re.search(r'<details class="attempt"[^>]*>\s*<summary>(.*?)</summary>', html, re.S)
    assert attempt
    assert re.search(rf"· failed {RECENT} after 1 min 23 s$", text(attempt[1])), attempt[1]


async def test_output_says_why_there_is_none(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    client = cyclone_env.client
    failed = await failed_run(cyclone_env)
    signalled = await approval.submit(client, {"id": 1})  # no result node
    await client.signal(signalled.id, "approve", True)
    done = await echo.enqueue(client, None)  # a job that returns null
    FAILING["charge"] = False
    shipped = await pipeline.submit(client, {"id": 2})
    await cyclone_env.drain(steps=STEPS, workflows=WORKFLOWS)
    assert await signalled.status() is cyclone.RunState.COMPLETED
    pending = await forever.enqueue(client, None)  # no worker: it stays pending
    cancelled = await forever.enqueue(client, None)
    await cancelled.cancel()

    async def output(run_id: uuid.UUID) -> str:
        async with make_dash() as dash:
            html = (await dash.get(f"/runs/{run_id}")).text
        return text(html.split("<h2>Output</h2>", 1)[1].split("</section>", 1)[0])

    assert await output(failed) == "No output: the run failed."
    assert await output(pending.id) == "None yet: the run has not finished."
    assert await output(cancelled.id) == "No output: the run was cancelled."
    assert await output(signalled.id) == (
        "No output: this workflow has no result node, or its result is null."
    )
    assert await output(done.id) == "null"
    assert await output(shipped.id) == '"shipped"'


async def test_runs_rows_are_compact(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    failed = await failed_run(cyclone_env)
    async with make_dash() as dash:
        html = (await dash.get("/runs")).text
    row = re.search(rf'<tr data-run="{failed}">(.*?)</tr>', html, re.S)
    assert row
    # The id's random tail, linking to the run, the whole id on hover.
    link = f'<a class="id" href="/runs/{failed}" title="{failed}">…{str(failed)[-8:]}</a>'
    assert link in row[1]
    times = re.findall(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', row[1])
    assert len(times) == 2, row[1]
    assert all(re.fullmatch(RECENT, t[2]) and t[1].endswith(" UTC") for t in times), times
    assert 'Finished</th><th class="num">Took</th>' in html
    # The time filters' hints read as hints, not as values.
    placeholders = re.findall(r'name="(after|before)" value="" placeholder="([^"]+)"', html)
    assert placeholders == [("after", "e.g. 2025-01-31T14:05"), ("before", "e.g. 2025-02-01")]


async def test_pause_a_queue_whose_work_no_worker_serves(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    client = cyclone_env.client
    await echo.enqueue_many(client, [1, 2, 3], queue="incident")  # no worker, no setting
    async with make_dash() as dash:
        html = (await dash.get("/")).text
        assert 'data-queue="incident"' in html and 'id="no-workers"' in html
        assert 'action="/queues/incident/pause"' in html
        paused = await dash.post("/queues/incident/pause", {}, headers={"HX-Request": "true"})
        assert paused.status_code == 200, paused.text
        assert "Queue incident paused: workers claim nothing more from it." in paused.text
        assert (await client.queues.get("incident")).paused
        assert 'action="/queues/incident/resume"' in paused.text
        resumed = await dash.post("/queues/incident/resume", {})
        assert resumed.status_code == 200 and "Queue incident resumed." in resumed.text
        assert not (await client.queues.get("incident")).paused
        # A queue the overview does not list is refused, and nothing is written.
        unknown = await dash.post("/queues/nosuch/pause", {})
        assert unknown.status_code == 409
        assert (
            "Not paused: queue &#39;nosuch&#39; has no work, no setting and no live worker;"
            " reload the overview for the queues it lists"
        ) in unknown.text
    stored = await cyclone_env.pool.fetch("SELECT queue FROM cyclone_queues")
    assert [r["queue"] for r in stored] == ["incident"]
