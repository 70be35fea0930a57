"""The state columns of a migrated schema hold exactly the states of cyclone._model.states."""

from __future__ import annotations

import re

from cyclone._model.states import STATES, TaskState
from cyclone.testing.plugin import CycloneEnv


async def test_each_state_column_accepts_its_vocabulary(cyclone_env: CycloneEnv) -> None:
    rows = await cyclone_env.pool.fetch(
        "SELECT t.relname AS tab, pg_get_constraintdef(c.oid) AS def FROM pg_constraint c"
        " JOIN pg_class t ON t.oid = c.conrelid"
        " WHERE c.contype = 'c' AND t.relname LIKE 'cyclone\\_%'"
    )
    checks: dict[str, set[str]] = {}
    for row in rows:
        listed = re.fullmatch(
            r"CHECK \(\(state = ANY \(ARRAY\[(.*)\]\)\)\)( NOT VALID)?", row["def"]
        )
        if listed:
            checks[row["tab"]] = set(re.findall(r"'(\w+)'::text", listed[1]))
    assert checks == {table.value: set(states) for table, states in STATES.items()}
    # The lease rule names a task state too.
    leased = [r["def"] for r in rows if "lease_until" in r["def"]]
    assert leased == [
        f"CHECK (((state = '{TaskState.RUNNING}'::text) = (lease_until IS NOT NULL)))"
    ]
