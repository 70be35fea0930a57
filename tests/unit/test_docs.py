"""Every Python block in the docs and the README parses, and names only what exists; every
snippet that submits once is retried by tests/docs; install lines name the distribution."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib

import pytest

import cyclone
from tests.conftest import DOC_PAGES, ROOT, RUN_PAGES, doc_blocks

DISTRIBUTION = "cyclone-pg"
# `pip install cyclone`, `pip install -U cyclone` or `cyclone[cli]`: the index's other cyclone.
WRONG_DISTRIBUTION = re.compile(
    r"pip install(?:\s+[^\s`#;&|)]+)*?\s+['\"]?cyclone(?![\w-])|(?<![\w-])cyclone\["
)


def blocks() -> list[tuple[str, str]]:
    found = []
    for page in DOC_PAGES:
        for i, block in enumerate(doc_blocks(page)):
            found.append((f"{page.name}#{i + 1}", block.code))
    return found


@pytest.mark.parametrize(("where", "code"), blocks(), ids=[w for w, _ in blocks()])
def test_block_parses_and_uses_real_names(where: str, code: str) -> None:
    tree = ast.parse(code, filename=where)
    for node in ast.walk(tree):  # `import cyclone.web` makes cyclone.web an attribute
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("cyclone."):
                    importlib.import_module(alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cyclone"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module}.{alias.name}"
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "cyclone"
        ):
            assert hasattr(cyclone, node.attr), f"{where}: cyclone.{node.attr} does not exist"


def test_every_public_name_is_documented() -> None:
    reference = (ROOT / "docs" / "reference.md").read_text()
    source = (ROOT / "cyclone" / "_model" / "errors.py").read_text()
    errors = set(re.findall(r"class (\w+)\(", source))
    for name in cyclone.__all__:
        obj = getattr(cyclone, name)
        assert getattr(obj, "__doc__", None), f"cyclone.{name} has no docstring"
        assert f"cyclone.{name}" in reference or name in errors or name == "Tx", name


def test_all_is_sorted() -> None:
    """In ruff's order (RUF022): constants, then classes, then functions, each sorted."""

    def group(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2), name

    assert cyclone.__all__ == sorted(cyclone.__all__, key=group)


def test_every_submit_once_snippet_is_retried_or_says_why_not() -> None:
    """A snippet that submits once shows the retry-safe pattern: tests/docs runs it twice
    (``<!-- retry-safe -->``), unless it says why it makes no such claim."""
    unmarked = []
    for page in DOC_PAGES:
        for block in doc_blocks(page):
            where = f"{page.name}, block at line {block.line}"
            if "retry-safe" in block.markers:
                assert page in RUN_PAGES, f"{where}: tests/docs does not run {page.name}"
                assert "no retry claim" not in block.markers, where
            elif "submit_once" in block.code and not block.markers.get("no retry claim"):
                unmarked.append(where)
    assert not unmarked, (
        "mark each with <!-- retry-safe --> (run twice), <!-- retry-safe: CALL --> (CALL"
        f" awaited twice) or <!-- no retry claim: REASON -->: {unmarked}"
    )


def test_the_distribution_is_cyclone_pg() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION


def test_install_lines_name_the_distribution() -> None:
    assert f"pip install {DISTRIBUTION} " in (ROOT / "docs" / "index.md").read_text()
    wrong = [
        f"{page.name}:{number}: {line.strip()}"
        for page in DOC_PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if WRONG_DISTRIBUTION.search(line)
    ]
    assert not wrong, f"the distribution is {DISTRIBUTION} (`pip install {DISTRIBUTION}`): {wrong}"


@pytest.mark.parametrize(
    ("line", "wrong"),
    [
        ("pip install cyclone", True),
        ("pip install -U cyclone  # upgrade", True),
        ("pip install 'cyclone[cli]'", True),
        ('pip install "cyclone[test]"', True),
        ("pip install cyclone-pg", False),
        ("pip install 'cyclone-pg[cli]'", False),
        ("pip install -e '.[cli]'", False),
        ("The `cyclone` command (`pip install 'cyclone-pg[cli]'`)", False),
        ("pip install -e '.[cli]'  # plus the `cyclone` command", False),
        ("(`pip install -e '.[cli]'`) adds a `cyclone` command", False),
    ],
)
def test_wrong_distribution_pattern(line: str, wrong: bool) -> None:
    assert bool(WRONG_DISTRIBUTION.search(line)) is wrong


_DEATH = re.compile(r"\b(dies|died|dead|killed)\b")
_LEASE_WAIT = re.compile(r"leases? (runs? out|ran out|expires?|expired)")


def test_no_page_says_a_dead_workers_tasks_wait_out_a_lease() -> None:
    """A dead worker's tasks are released when a peer sees its liveness lock free (about a
    second); only a worker that hangs or is cut off waits out its lease."""
    wrong = []
    for page in DOC_PAGES:
        # Paragraphs, table rows and list items, then their sentences.
        parts = re.split(r"\n\s*\n|\n(?=\||- )", page.read_text())
        sentences = [s for p in parts for s in re.split(r"(?<=[.;])\s", " ".join(p.split()))]
        for sentence in sentences:
            if _DEATH.search(sentence) and _LEASE_WAIT.search(sentence):
                wrong.append(f"{page.name}: {sentence}")
    assert not wrong, "\n".join(wrong)
