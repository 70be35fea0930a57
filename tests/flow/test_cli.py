"""``cyclone queues ls|pause|resume|limit`` and the flow column of ``cyclone stats``, through
the real console script."""

from __future__ import annotations

import json

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.process import cli


async def test_queues_commands(cyclone_env: CycloneEnv) -> None:
    dsn, queues = cyclone_env.dsn, cyclone_env.client.queues
    code, out, err = await cli("queues", "pause", "mail", dsn=dsn)
    assert code != 0 and "queue 'mail' is unknown" in err
    code, out, err = await cli("queues", "pause", "mail", "--create", dsn=dsn)
    assert (code, out.strip()) == (0, "paused mail"), err
    code, out, err = await cli(
        "queues", "limit", "mail", "--concurrency", "3", "--rate", "20", "--per", "1", dsn=dsn
    )
    assert (code, out.strip()) == (0, "mail: 3 at once, 20/1s"), err
    code, out, err = await cli("queues", "limit", "mail", "--concurrency", "0", dsn=dsn)
    assert code != 0 and "concurrency must be at least 1" in err
    code, out, err = await cli("queues", "limit", "mail", "--rate", "5", dsn=dsn)
    assert code != 0 and "rate=5 needs its period" in err
    code, out, err = await cli(
        "queues", "limit", "send.mail", "--kind", "--concurrency", "2", dsn=dsn
    )
    assert (code, out.strip()) == (0, "kind send.mail: 2 at once"), err
    code, out, err = await cli("queues", "ls", "--json", dsn=dsn)
    listed = json.loads(out)
    assert listed["queues"][0]["queue"] == "mail" and listed["queues"][0]["paused"]
    assert listed["kinds"] == {"send.mail": {"concurrency": 2, "rate": None, "per": None}}
    code, out, err = await cli("queues", "ls", dsn=dsn)
    assert "paused, 3 at once, 20/1s" in out and "kind send.mail" in out
    code, out, err = await cli("stats", dsn=dsn)
    assert code == 0 and "paused, 3 at once" in out, (out, err)
    code, out, err = await cli(
        "queues", "limit", "bulk", "--key-rate", "10", "--key-per", "1", "--create", dsn=dsn
    )
    assert (code, out.strip()) == (0, "bulk: 10/1s per key"), err
    code, out, err = await cli("queues", "limit", "bulk", "--key-rate", "10", dsn=dsn)
    assert code != 0 and "key_rate=10 needs its period: key_per=1.0" in err
    code, out, err = await cli("queues", "ls", dsn=dsn)
    assert "10/1s per key" in out
    code, out, err = await cli("queues", "limit", "bulk", dsn=dsn)
    assert (code, out.strip()) == (0, "bulk: no limits"), err
    code, out, err = await cli("queues", "resume", "mail", dsn=dsn)
    assert (code, out.strip()) == (0, "resumed mail"), err
    assert (await queues.get("mail")).limits == cyclone.QueueLimits(3, 20, 1.0)
    code, out, err = await cli("queues", "limit", "mail", dsn=dsn)
    assert (code, out.strip()) == (0, "mail: no limits"), err
    assert await queues.list() == []
