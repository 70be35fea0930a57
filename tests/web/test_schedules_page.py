"""The dashboard's schedules page: the stored schedules, and pause, resume and trigger."""

from __future__ import annotations

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.web.conftest import Make
from tests.web.flows import echo


async def test_schedules_page_lists_and_steers(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    schedules = cyclone_env.client.schedules
    await schedules.create(
        cyclone.schedule("web.nightly", echo, cron="0 3 * * *", tz="Europe/Paris", input=1)
    )
    name = "web.nightly"
    async with make_dash() as dash:
        page = await dash.get("/schedules")
        assert page.status_code == 200
        assert "cron <code>0 3 * * *</code> Europe/Paris" in page.text
        assert "active" in page.text
        paused = await dash.post(f"/schedules/{name}/pause", {}, headers={"HX-Request": "true"})
        assert paused.status_code == 200 and "paused." in paused.text
        assert paused.text.startswith('<div id="live"')
        assert (await schedules.get(name)).paused
        wrong = await dash.http.post(f"/schedules/{name}/resume", data={"csrf": "0" * 64})
        assert wrong.status_code == 403 and (await schedules.get(name)).paused
        resumed = await dash.post(f"/schedules/{name}/resume", {})
        assert resumed.status_code == 200 and not (await schedules.get(name)).paused
        triggered = await dash.post(f"/schedules/{name}/trigger", {})
        assert triggered.status_code == 200 and "run key schedule:" in triggered.text
        assert (await schedules.get(name)).triggered_at is not None
        missing = await dash.post("/schedules/web.none/pause", {})
        assert missing.status_code == 409 and "no schedule named" in missing.text
        live = await dash.get("/schedules/live", headers={"HX-Request": "true"})
        assert live.text.startswith('<div id="live"') and "<html" not in live.text


async def test_schedules_page_is_read_only_without_auth_off_loopback(
    cyclone_env: CycloneEnv, make_dash: Make
) -> None:
    await cyclone_env.client.schedules.create(
        cyclone.schedule("web.hourly", echo, cron="@hourly", input=1)
    )
    async with make_dash("203.0.113.9") as dash:
        page = await dash.get("/schedules")
        assert page.status_code == 200 and "web.hourly" in page.text
        assert "/schedules/web.hourly/pause" not in page.text
        refused = await dash.post("/schedules/web.hourly/pause", {})
        assert refused.status_code in (404, 405)
    assert not (await cyclone_env.client.schedules.get("web.hourly")).paused
