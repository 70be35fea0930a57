"""``cyclone schedules ls|pause|resume|trigger``."""

from __future__ import annotations

import datetime as dt
import json

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.cli.process import cli, one_line_error


async def test_schedules_commands(cyclone_env: CycloneEnv) -> None:
    dsn = cyclone_env.dsn
    await cyclone_env.client.schedules.create(
        cyclone.schedule("cli.hourly", echo, cron="@hourly", tz="Europe/Paris", input=1)
    )
    code, out, err = await cli("schedules", "ls", dsn=dsn)
    assert code == 0, err
    assert "cli.hourly" in out and "cron '@hourly' Europe/Paris" in out and "active" in out
    code, out, err = await cli("schedules", "pause", "cli.hourly", dsn=dsn)
    assert (code, out.strip()) == (0, "paused cli.hourly"), err
    code, out, err = await cli("schedules", "ls", "--json", dsn=dsn)
    listed = json.loads(out)
    assert [(s["name"], s["paused"], s["dynamic"]) for s in listed] == [("cli.hourly", True, True)]
    code, out, err = await cli("schedules", "resume", "cli.hourly", dsn=dsn)
    assert (code, out.strip()) == (0, "resumed cli.hourly"), err
    code, out, err = await cli("schedules", "trigger", "cli.hourly", dsn=dsn)
    assert code == 0, err
    assert out.strip().startswith("schedule:cli.hourly:trigger:")
    info = await cyclone_env.client.schedules.get("cli.hourly")
    assert not info.paused and info.triggered_at is not None
    assert info.next_at > dt.datetime.now(dt.UTC)
    code, _, err = await cli("schedules", "pause", "cli.none", dsn=dsn)
    assert one_line_error(code, err) == (
        "cyclone: no schedule named 'cli.none': `cyclone schedules ls` lists the stored schedules"
    )
