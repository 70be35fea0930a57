"""Names at every boundary: schema names are identifiers (validated, then quoted); queue names
are short words; kind, workflow and node names are values, sent only as parameters."""

from __future__ import annotations

from typing import Any

import pytest

import cyclone
from cyclone._storage.loader import _STATEMENTS, Queries
from cyclone.testing.plugin import CycloneEnv
from tests.cli.process import cli, one_line_error
from tests.conftest import count_rows

BAD_SCHEMAS = [
    "",
    "Public",  # upper case would need quoting to keep
    'a"b',
    "a;drop schema public cascade",
    "a b",
    "1a",
    "é",
    "a\x00b",
    "a" * 56,  # cyclone_ + 56 > 63: PostgreSQL would cut the channel name silently
]
BAD_QUEUES = ["", "a b", "a,b", 'q"', "q'", "a;b", "é", "a\x00", "q" * 129, "a\nb"]
# Characters SQL or a shell would treat specially: stored and matched as they are.
ODD_NAMES = ["sec.x'); DROP TABLE cyclone_runs; --", 'sec."quoted"', "sec.ünï名😀", "sec.%_\\"]
BAD_NAMES = ["", "a\x00b", "lone \udc80", "n" * 201]


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_bad_schema_names_are_refused(cyclone_env: CycloneEnv, schema: str) -> None:
    with pytest.raises(cyclone.InvalidNameError) as caught:
        cyclone.Client(cyclone_env.pool, schema=schema)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, cyclone.CycloneError)
    assert "schema must be a lower-case identifier" in str(caught.value)


async def test_a_bad_schema_name_through_the_cli(cyclone_env: CycloneEnv) -> None:
    code, _, err = await cli("--schema", 'x";drop', "runs", "ls", dsn=cyclone_env.dsn)
    assert one_line_error(code, err).startswith("cyclone: --schema must be a lower-case")


def test_the_schema_name_is_the_only_text_put_into_sql() -> None:
    q = Queries("s_0")
    for name, statement in _STATEMENTS.items():
        default_clock = statement.sql.replace("__now__", "now()")
        assert q[name] == default_clock.replace("__schema__", '"s_0"')


async def test_the_longest_schema_name_keeps_its_channel(cyclone_env: CycloneEnv) -> None:
    schema = "s" * 55
    client = cyclone.Client(cyclone_env.pool, schema=schema)
    assert len(client._channel) == 63  # PostgreSQL's limit, not cut
    await client.migrate()
    run = await echo.enqueue(client, {"n": 1})
    # A poll a minute: the wakeup on the 63-character channel does it.
    async with cyclone.Worker(client, steps=[echo], poll_interval=60.0):
        await client.services.notifier.connected.wait()
        assert await run.result(timeout=30) == {"n": 1}
        second = await echo.enqueue(client, {"n": 2})
        assert await second.result(timeout=30) == {"n": 2}


@pytest.mark.parametrize("queue", BAD_QUEUES)
async def test_bad_queue_names_are_refused_everywhere(cyclone_env: CycloneEnv, queue: str) -> None:
    with pytest.raises(cyclone.InvalidNameError):
        cyclone.step(f"sec.q{len(queue)}", queue=queue)(_echo)
    with pytest.raises(cyclone.InvalidNameError):
        await echo.enqueue(cyclone_env.client, 1, queue=queue)
    with pytest.raises(cyclone.InvalidNameError):
        cyclone.Worker(cyclone_env.client, steps=[echo], queues={queue: 1})
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def _echo(ctx: cyclone.Context, value: Any) -> Any:
    return value


echo = cyclone.step("sec.echo", queue="sec")(_echo)


@pytest.mark.parametrize("name", ODD_NAMES)
async def test_odd_kind_workflow_and_node_names_are_plain_values(
    cyclone_env: CycloneEnv, name: str
) -> None:
    kind = cyclone.step(name, queue="sec_odd")(_echo)
    flow = cyclone.define(name + ".flow", int)
    flow.node(kind, name=name + ".node")
    job = await kind.enqueue(cyclone_env.client, 1)
    run = await flow.submit(cyclone_env.client, 2)
    await cyclone_env.drain(steps=[kind], workflows=[flow])
    assert (await job.info()).state == cyclone.RunState.COMPLETED
    info = await run.info()
    assert (info.name, info.state) == (name + ".flow", cyclone.RunState.COMPLETED)
    assert [n.name for n in info.nodes] == [name + ".node"]
    page = await cyclone_env.client.list_runs(cyclone.RunQuery(name=name + ".flow"))
    assert [r.id for r in page.runs] == [run.id]
    assert await count_rows(cyclone_env, "cyclone_runs") == 2  # no table was dropped


@pytest.mark.parametrize("name", BAD_NAMES)
def test_names_that_cannot_be_stored_are_refused_at_declaration(name: str) -> None:
    with pytest.raises(cyclone.InvalidNameError):
        cyclone.step(name)(_echo)
    with pytest.raises(cyclone.InvalidNameError):
        cyclone.define(name, int)
    flow = cyclone.define(f"sec.bad_node.{len(name)}.{name.isprintable()}", int)
    if name:  # an empty node name means the step's own
        with pytest.raises(cyclone.InvalidNameError):
            flow.node(echo, name=name)
    with pytest.raises(cyclone.InvalidNameError):
        flow.wait(name)


@pytest.mark.parametrize("text", ["a\x00b", "lone \udc80"])
async def test_lookups_by_name_refuse_what_cannot_be_stored(
    cyclone_env: CycloneEnv, text: str
) -> None:
    run = await echo.enqueue(cyclone_env.client, 1)
    with pytest.raises(cyclone.InvalidNameError):
        await cyclone_env.client.signal(run.id, text, None)
    with pytest.raises(cyclone.InvalidNameError):
        await cyclone_env.client.list_runs(cyclone.RunQuery(name=text))
    with pytest.raises(cyclone.InvalidKeyError):
        await cyclone_env.client.list_runs(cyclone.RunQuery(key=text))


async def test_the_cli_refuses_names_that_cannot_be_stored(cyclone_env: CycloneEnv) -> None:
    # A byte that is not UTF-8 in argv reaches Python as a lone surrogate.
    bad = b"k\xff".decode("utf-8", "surrogateescape")
    for args in (["runs", "ls", "--key", bad], ["runs", "ls", "--name", bad]):
        code, _, err = await cli(*args, dsn=cyclone_env.dsn)
        assert "lone surrogate" in one_line_error(code, err)
