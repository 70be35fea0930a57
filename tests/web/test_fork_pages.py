"""The dashboard's fork actions: a fork button per node of an ended workflow run, which forks
through ``client.fork`` (once per form) and opens the fork's page, both runs linking to each
other; a bulk fork of the selected runs from a node name."""

from __future__ import annotations

import re
import uuid

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.web.conftest import Make, failed_run
from tests.web.flows import FAILING, STEPS, WORKFLOWS, forever


async def test_fork_from_a_node_of_the_run_page(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run_id = await failed_run(cyclone_env)
    async with make_dash() as dash:
        page = await dash.get(f"/runs/{run_id}")
        [key] = re.findall(
            r'value="web.charge"><input type="hidden" name="key" value="([^"]+)"', page.text
        )
        form = {"from_node": "web.charge", "key": key}
        forked = await dash.post(f"/runs/{run_id}/fork", form)
        assert forked.status_code == 303
        fork_id = forked.headers["location"].rpartition("/")[2]
        again = await dash.post(f"/runs/{run_id}/fork", form)  # the form sent twice
        assert again.headers["location"].endswith(f"/runs/{fork_id}")
        fork_page = (await dash.get(f"/runs/{fork_id}")).text
        assert f'id="forked-from" href="/runs/{run_id}"' in fork_page
        assert "node web.charge" in fork_page
        source_page = (await dash.get(f"/runs/{run_id}")).text
        assert f'class="fork-link" href="/runs/{fork_id}"' in source_page
        unknown = await dash.post(f"/runs/{run_id}/fork", {"from_node": "<i>nope</i>"})
        assert unknown.status_code == 400
        assert "Not forked:" in unknown.text and "&lt;i&gt;nope&lt;/i&gt;" in unknown.text
        running = await forever.enqueue(cyclone_env.client, None)
        job = await dash.post(f"/runs/{running.id}/fork", {"from_node": "web.forever"})
        assert job.status_code == 409 and "only workflow runs fork" in job.text
        await running.cancel()
    FAILING["charge"] = False
    fork = await cyclone_env.client.get_run(uuid.UUID(fork_id))
    async with cyclone_env.worker(steps=STEPS, workflows=WORKFLOWS):
        assert await fork.wait(timeout=60) is cyclone.RunState.COMPLETED


async def test_bulk_fork_of_the_selected_runs(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    failed = [await failed_run(cyclone_env, {"id": i}) for i in range(2)]
    async with make_dash() as dash:
        confirm = await dash.get(
            "/runs/bulk",
            params={"action": "fork", "scope": "selected", "id": [str(f) for f in failed]},
        )
        assert 'id="bulk-count">Fork 2 runs?<' in confirm.text and 'id="fork-node"' in confirm.text
        [key] = re.findall(r'name="key" value="([^"]+)"', confirm.text)
        ids = [str(f) for f in failed]
        unnamed = await dash.post("/runs/bulk", {"action": "fork", "id": ids})
        assert unnamed.status_code == 400 and "name the node" in unnamed.text
        form = {"action": "fork", "id": ids, "from_node": "web.charge", "key": key}
        done = await dash.post("/runs/bulk", form)
        assert 'id="bulk-result">Forked 2 runs<' in done.text
        forks = re.findall(r'class="fork-link" href="/runs/([^"]+)"', done.text)
        assert len(set(forks)) == 2
        again = await dash.post("/runs/bulk", form)  # sent twice: the same forks
        assert re.findall(r'class="fork-link" href="/runs/([^"]+)"', again.text) == forks
    for source in failed:
        info = await cyclone.Run(cyclone_env.client, source).info()
        assert [node for _, node in info.forks] == ["web.charge"]
