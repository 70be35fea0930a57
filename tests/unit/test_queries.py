"""The wrappers of cyclone._storage.queries send each statement its declared parameters by
name, read from their source without a database."""

from __future__ import annotations

import ast
import re
from importlib import resources

import pytest

import cyclone._storage.queries
from cyclone._storage.loader import _STATEMENTS

_SENDERS = {"execute", "fetch", "fetchrow", "fetchval"}


def _sends() -> list[tuple[str, str, set[str], bool]]:
    """(module, statement, keywords, whether more come from a **mapping) of every call that
    names its statement literally."""
    found = []
    for entry in resources.files(cyclone._storage.queries).iterdir():
        if not entry.name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(entry.read_text("utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in _SENDERS
                and len(node.args) == 3
                and isinstance(node.args[2], ast.Constant)
            ):
                continue
            keywords = {k.arg for k in node.keywords if k.arg is not None}
            spread = any(k.arg is None for k in node.keywords)
            found.append((entry.name, node.args[2].value, keywords, spread))
    return found


def test_every_wrapper_passes_its_statements_parameters_by_name() -> None:
    sends = _sends()
    assert len(sends) > 70  # the walk found the wrappers
    for module, statement, keywords, spread in sends:
        declared = set(_STATEMENTS[statement].params)
        if spread:
            assert keywords <= declared, (module, statement, keywords - declared)
        else:
            assert keywords == declared, (module, statement, keywords ^ declared)


def test_every_statement_has_a_wrapper() -> None:
    sent = {statement for _, statement, _, _ in _sends()}
    assert set(_STATEMENTS) - sent == set()


@pytest.mark.parametrize("statement", ["task_claim", "task_claim_plain"])
def test_the_claim_scans_at_most_claim_max_tasks(statement: str) -> None:
    """A claim's one constant LIMIT is CLAIM_MAX (a worker never asks for more), so that
    the planner costs its scan for that many rows whatever the backlog."""
    sql = _STATEMENTS[statement].sql
    constants = [n for n in re.findall(r"LIMIT (\d+)", sql) if n != "1"]  # probes take one
    assert constants == [str(cyclone._storage.queries.CLAIM_MAX)]
