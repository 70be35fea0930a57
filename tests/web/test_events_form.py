"""The run page's signal form delivers an event to a node waiting for events, checked as
``client.signal`` checks it."""

from __future__ import annotations

import msgspec

from cyclone.testing.plugin import CycloneEnv
from tests.integration.test_events import decision
from tests.web.conftest import Make


async def test_the_signal_form_sends_an_event(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run = await decision.submit(cyclone_env.client, 1)
    async with make_dash() as dash:
        page = (await dash.get(f"/runs/{run.id}")).text
        assert '<input name="event"' in page
        form = {"node": "choice", "payload": '{"by": "ops"}'}
        missing = await dash.post(f"/runs/{run.id}/signal", form)
        assert missing.status_code == 400 and "no event is not one" in missing.text
        typo = await dash.post(f"/runs/{run.id}/signal", {**form, "event": "rejected"})
        assert typo.status_code == 400 and "must be" in typo.text  # not a Rejection
        ok = await dash.post(f"/runs/{run.id}/signal", {**form, "event": "approved"})
        assert ok.status_code == 200 and "Signalled" in ok.text
    stored = await cyclone_env.pool.fetchval(
        "SELECT signal::text FROM cyclone_steps WHERE run_id = $1 AND node = 'choice'", run.id
    )
    assert msgspec.json.decode(stored) == {"name": "approved", "payload": {"by": "ops"}}
