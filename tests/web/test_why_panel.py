"""The run page's "Why is this not running?" panel: each open node's reason, for a run that
has not ended, refreshed with the page's live part."""

from __future__ import annotations

from cyclone.testing.plugin import CycloneEnv
from tests.web.conftest import Make, failed_run
from tests.web.flows import approval


async def test_a_run_that_waits_says_why(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run = await approval.submit(cyclone_env.client, {"order": 1})
    async with make_dash() as dash:
        for path in (f"/runs/{run.id}", f"/runs/{run.id}/live"):
            html = (await dash.get(path, headers={"HX-Request": "true"})).text
            assert "Why is this not running?" in html, path
            assert 'data-node="approve" data-code="waiting_for_signal"' in html
            assert "client.signal(run_id, &#39;approve&#39;, payload)" in html
            assert 'data-node="after" data-code="waiting_on_parents"' in html
            assert "Waits for approve to complete." in html


async def test_a_run_that_ended_has_no_panel(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run_id = await failed_run(cyclone_env)
    async with make_dash() as dash:
        html = (await dash.get(f"/runs/{run_id}")).text
        assert 'id="run-state">failed<' in html and 'id="why"' not in html
