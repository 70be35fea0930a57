"""The soak runs only when named (``pytest tests/soak``, as .ci/run does): it takes minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the soak out unless the command line names tests/soak (or a test in it)."""
    named = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if any(path == _HERE or _HERE in path.parents for path in named):
        return
    soak = [item for item in items if _HERE in item.path.parents]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if _HERE not in item.path.parents]
