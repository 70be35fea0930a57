"""The dashboard's pause and resume buttons on the overview, through httpx on the ASGI app:
CSRF-protected, absent and refused when read-only, through client.queues."""

from __future__ import annotations

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.web.conftest import Make, make_dash  # noqa: F401 - the fixture
from tests.web.flows import echo


async def test_pause_and_resume_from_the_overview(cyclone_env: CycloneEnv, make_dash: Make) -> None:  # noqa: F811
    client = cyclone_env.client
    await echo.enqueue_many(client, [1, 2])
    await client.queues.set_limits(echo.queue, concurrency=4, create=True)
    async with make_dash() as dash:
        html = (await dash.get("/")).text
        assert "4 at once" in html and 'class="queue-pause"' in html
        refused = await dash.http.post(f"/queues/{echo.queue}/pause", data={"csrf": "forged"})
        assert refused.status_code == 403
        assert not (await client.queues.get(echo.queue)).paused
        paused = await dash.post(f"/queues/{echo.queue}/pause", {}, headers={"HX-Request": "true"})
        assert paused.status_code == 200 and paused.text.startswith('<div id="live"')
        assert f"Queue {echo.queue} paused" in paused.text and 'class="queue-resume"' in paused.text
        assert (await client.queues.get(echo.queue)).paused
        again = await dash.post(f"/queues/{echo.queue}/pause", {})
        assert "was paused already" in again.text
        resumed = await dash.post(f"/queues/{echo.queue}/resume", {})
        assert resumed.status_code == 200 and f"Queue {echo.queue} resumed" in resumed.text
        assert not (await client.queues.get(echo.queue)).paused
    async with make_dash(read_only=True) as dash:
        html = (await dash.get("/")).text
        assert "4 at once" in html and "queue-pause" not in html
        refused = await dash.post(f"/queues/{echo.queue}/pause", {})
        assert refused.status_code in (404, 405)
    assert not (await client.queues.get(echo.queue)).paused
    assert (await client.queues.get(echo.queue)).limits == cyclone.QueueLimits(concurrency=4)
