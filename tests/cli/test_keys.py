"""``cyclone keys`` and ``CYCLONE_KEYS``: counts per key, rotation, and ``runs show`` with
and without the key."""

from __future__ import annotations

import json

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.cli.process import cli, environment, one_line_error

OLD = cyclone.Keyring.generate_key()
NEW = cyclone.Keyring.generate_key()


def with_keys(dsn: str, keys: str) -> dict[str, str]:
    return {**environment(dsn), "CYCLONE_KEYS": keys}


async def test_show_count_and_rotate(cyclone_env: CycloneEnv) -> None:
    dsn = cyclone_env.dsn
    keyring = cyclone.Keyring({"old": OLD}, current="old")
    async with cyclone.Client(cyclone_env.pool, cipher=keyring) as client:
        run = await echo.enqueue(client, 41)
    # Without the key the payload is redacted; with it, shown.
    code, out, err = await cli("runs", "show", str(run.id), "--json", dsn=dsn)
    assert code == 0, err
    assert json.loads(out)["input"] == "<encrypted with key old>"
    code, out, err = await cli(
        "runs", "show", str(run.id), "--json", env=with_keys(dsn, f"old={OLD}")
    )
    assert (code, json.loads(out)["input"]) == (0, 41), err
    code, out, err = await cli("keys", "count", "--json", dsn=dsn)
    assert (code, json.loads(out)) == (0, {"old": 1}), err
    # Rotation needs the keyring, and says so.
    code, _, err = await cli("keys", "rotate", dsn=dsn)
    assert "needs a keyring" in one_line_error(code, err)
    rotating = with_keys(dsn, f"new={NEW},old={OLD}")
    code, out, err = await cli("keys", "rotate", "--batch", "10", env=rotating)
    assert code == 0, err
    assert out.strip() == "re-sealed 1 rows; sealed values per key: new: 1"
    code, out, err = await cli(
        "runs", "show", str(run.id), "--json", env=with_keys(dsn, f"new={NEW}")
    )
    assert (code, json.loads(out)["input"]) == (0, 41), err


async def test_a_bad_keyring_is_one_line(cyclone_env: CycloneEnv) -> None:
    code, _, err = await cli("keys", "count", env=with_keys(cyclone_env.dsn, "old"))
    assert "'id=base64key,id=base64key'" in one_line_error(code, err)
