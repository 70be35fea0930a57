"""``cyclone runs fork``: a fork from the command line, once per key, linked both ways in
``cyclone runs show``; a run whose workflow the command did not import is refused."""

from __future__ import annotations

import uuid

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo, pipeline
from tests.cli.process import cli, one_line_error
from tests.conftest import fast_worker


async def test_fork_from_the_command_line(cyclone_env: CycloneEnv) -> None:
    client, dsn = cyclone_env.client, cyclone_env.dsn
    run = await pipeline.submit(client, 2)
    async with fast_worker(client, steps=[echo], workflows=[pipeline]):
        assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    rid = str(run.id)
    fork_args = ("runs", "fork", rid, "--from", "second", "--import", "tests.cli.app")
    code, out, err = await cli(*fork_args, "--input", "5", "--key", "k1", dsn=dsn)
    assert code == 0, err
    assert out.startswith(f"forked {rid} from second: ")
    fork_id = uuid.UUID(out.strip().rpartition(" ")[2])
    code, out, err = await cli(*fork_args, "--input", "5", "--key", "k1", dsn=dsn)
    assert (code, out.strip()) == (0, f"key k1 had already forked {rid} from second: {fork_id}")
    code, _, err = await cli(*fork_args, "--input", "{5", dsn=dsn)
    assert one_line_error(code, err).startswith("cyclone: --input is not JSON (")
    code, _, err = await cli("runs", "fork", rid, "--from", "nope", "--import", "json", dsn=dsn)
    assert "workflow 'cli.pipeline'" in one_line_error(code, err)  # not defined in json
    code, _, err = await cli(*fork_args[:-2], "--import", "tests.cli.nowhere", dsn=dsn)
    assert one_line_error(code, err).startswith("cyclone: cannot import tests.cli.nowhere")
    code, out, err = await cli("runs", "show", rid, dsn=dsn)
    assert f"fork: {fork_id} from node second\n" in out, err
    code, out, err = await cli("runs", "show", str(fork_id), dsn=dsn)
    assert f"forked from: {rid} at node second\n" in out, err
    fork = await client.get_run(fork_id)
    async with fast_worker(client, steps=[echo], workflows=[pipeline]):
        assert await fork.wait(timeout=60) is cyclone.RunState.COMPLETED
    info = await fork.info()
    assert info.input == 5 and {n.name: n.attempts for n in info.nodes} == {
        "first": 1,
        "second": 1,
    }
    assert (await fork.payloads()).nodes["first"].output == 2  # copied from the run
