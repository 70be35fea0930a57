"""The integration tests' own hook: with ``--citus``, tests marked ``plain_only`` are skipped."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--citus``, skip each ``@pytest.mark.plain_only("why")`` test, saying why."""
    if not config.getoption("--citus"):
        return
    for item in items:
        marker = item.get_closest_marker("plain_only")
        if marker is None:
            continue
        if not marker.args or not str(marker.args[0]).strip():
            raise pytest.UsageError(f"{item.nodeid}: plain_only needs a reason")
        item.add_marker(pytest.mark.skip(reason=f"plain PostgreSQL only: {marker.args[0]}"))
