"""``cyclone queues`` on a queue that no setting or live worker uses: one line naming the
command's own flag, exit 1, nothing written."""

from __future__ import annotations

import pytest

from cyclone.testing.plugin import CycloneEnv
from tests.cli.process import cli, one_line_error

UNKNOWN = (
    "cyclone: queue 'nosuchqueue' is unknown: no setting or live worker uses it; check the name"
)


@pytest.mark.parametrize(
    "args",
    [
        ["queues", "pause", "nosuchqueue"],
        ["queues", "limit", "nosuchqueue", "--concurrency", "3"],
        ["queues", "limit", "nosuchqueue"],
    ],
)
async def test_an_unknown_queue_says_pass_create(cyclone_env: CycloneEnv, args: list[str]) -> None:
    code, out, err = await cli(*args, dsn=cyclone_env.dsn)
    assert code == 1 and out == ""
    assert one_line_error(code, err) == (
        f"{UNKNOWN}, or pass --create to configure it before its first use"
    )
    assert await cyclone_env.client.queues.list() == []


async def test_resuming_an_unknown_queue_says_it_is_not_paused(cyclone_env: CycloneEnv) -> None:
    code, out, err = await cli("queues", "resume", "nosuchqueue", dsn=cyclone_env.dsn)
    assert code == 1 and out == ""
    assert one_line_error(code, err) == (
        f"{UNKNOWN}; a queue without a setting is not paused, so there is nothing to resume"
    )
    assert await cyclone_env.client.queues.list() == []
