"""Fixtures of the chaos suite and the table of figures printed at the end of its run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.chaos.cluster import Cluster, cluster_from, template_data
from tests.chaos.harness import HEADER, Figures, Scene

_FIGURES = pytest.StashKey[list[Figures]]()
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the chaos scenarios out unless the command line names tests/chaos (or a test in
    it): they take minutes, and the default run is the README's quick one."""
    named = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if any(path == _HERE or _HERE in path.parents for path in named):
        return
    chaos = [item for item in items if _HERE in item.path.parents]
    if chaos:
        config.hook.pytest_deselected(items=chaos)
        items[:] = [item for item in items if _HERE not in item.path.parents]


@pytest.fixture(scope="session")
def chaos_template() -> Iterator[Path]:
    """A data directory made by initdb once per session; each scenario's cluster copies it."""
    with template_data() as data:
        yield data


@pytest.fixture
def chaos_cluster(chaos_template: Path) -> Iterator[Cluster]:
    """A PostgreSQL server of the scenario's own: its faults may crash or stop it."""
    with cluster_from(chaos_template) as cluster:
        yield cluster


@pytest_asyncio.fixture
async def scene(
    request: pytest.FixtureRequest, chaos_cluster: Cluster, tmp_path: Path
) -> AsyncIterator[Scene]:
    """The scenario's database on its own cluster, and its processes (stopped afterwards)."""
    name = request.node.name.removeprefix("test_")
    scene = Scene(name, chaos_cluster.dsn_for("chaos"), chaos_cluster.dsn, tmp_path)
    await scene.prepare()
    try:
        yield scene
    finally:
        await scene.reap()


@pytest.fixture
def record_figures(request: pytest.FixtureRequest) -> Any:
    """Keep a scenario's figures for the table at the end of the run."""

    def record(figures: Figures) -> None:
        request.config.stash.setdefault(_FIGURES, []).append(figures)

    return record


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print each scenario's figures as a Markdown table (the one docs/operations.md keeps)."""
    figures = config.stash.get(_FIGURES, [])
    if not figures:
        return
    terminalreporter.section("chaos figures")
    for line in table(figures):
        terminalreporter.write_line(line)
    for f in figures:
        for error in f.error_lines[:5]:
            terminalreporter.write_line(f"{f.scenario}: ERROR {error}")


def table(figures: list[Figures]) -> list[str]:
    """The figures as the lines of a Markdown table."""
    rows = [HEADER, ["---"] * len(HEADER), *(f.row() for f in figures)]
    return ["| " + " | ".join(row) + " |" for row in rows]
