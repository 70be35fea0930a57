"""Every Python block in the docs and the README parses, and names only what exists."""

from __future__ import annotations

import ast
import importlib
import re

import pytest

import cyclone
from tests.conftest import PYTHON_BLOCK, ROOT

PAGES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"])


def blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for i, match in enumerate(PYTHON_BLOCK.finditer(page.read_text())):
            found.append((f"{page.name}#{i + 1}", match[1]))
    return found


@pytest.mark.parametrize(("where", "code"), blocks(), ids=[w for w, _ in blocks()])
def test_block_parses_and_uses_real_names(where: str, code: str) -> None:
    tree = ast.parse(code, filename=where)
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
    errors = set(re.findall(r"class (\w+)\(", (ROOT / "cyclone" / "_errors.py").read_text()))
    for name in cyclone.__all__:
        obj = getattr(cyclone, name)
        assert getattr(obj, "__doc__", None), f"cyclone.{name} has no docstring"
        assert f"cyclone.{name}" in reference or name in errors or name == "Tx", name


def test_all_is_sorted() -> None:
    assert cyclone.__all__ == sorted(cyclone.__all__)
