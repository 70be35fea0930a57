"""The state machine of cyclone._model.states against the SQL: every write of a state column is a
listed transition, every listed transition is a write, and the vocabularies are the CHECKs.

The statements are read by name through the loader (fragments filled in) and parsed just
enough to find each write of cyclone_runs, cyclone_steps or cyclone_tasks: the table, the
states it sets (a literal, each branch of a CASE, or a parameter) and the state predicates
among the top-level conditions of its WHERE (a guard on every row it writes).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

import pytest

from cyclone._model.states import (
    STATES,
    STORED_RUN_STATES,
    TRANSITIONS,
    NodeState,
    ReportedNodeState,
    Table,
    Transition,
)
from cyclone._storage import loader as _loader
from tests.conftest import ROOT

PARAM = "<parameter>"  # the state a statement sets from a parameter
KEPT = "<unchanged>"  # a CASE branch that keeps the row's state

_TOKEN = re.compile(r"'(?:[^']|'')*'|\$\d+|(?<!:):\w+|::\w+|\w+|<>|\S", re.DOTALL)
_HEAD = re.compile(
    r"\b(?P<op>UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+(?:\"?\w+\"?\.)?"
    r"(?P<table>cyclone_(?:runs|steps|tasks))\b"
    r"(?:\s+(?:AS\s+)?(?!(?:SET|WHERE|USING|VALUES|SELECT|RETURNING)\b)(?P<alias>\w+))?",
    re.IGNORECASE,
)
_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


@dataclass(frozen=True)
class Write:
    """One write of a state table in a statement."""

    statement: str
    table: Table
    op: str  # insert, update or delete
    targets: frozenset[str | None]  # None: the row is deleted
    guard_in: frozenset[str] | None  # the row's state is one of these (None: no such guard)
    guard_not: frozenset[str]  # the row's state is none of these


def tokens(sql: str) -> list[str]:
    return _TOKEN.findall(_COMMENT.sub(" ", sql))


def until_close(toks: list[str]) -> list[str]:
    """The tokens up to the parenthesis that closes the one they start in (or the end)."""
    depth = 0
    for i, tok in enumerate(toks):
        depth += (tok == "(") - (tok == ")")
        if depth < 0 or (depth == 0 and tok == ";"):
            return toks[:i]
    return toks


def split_top(toks: list[str], *words: str) -> list[tuple[str, list[str]]]:
    """``toks`` cut at each of ``words`` outside parentheses: (word, tokens after it)."""
    parts: list[tuple[str, list[str]]] = [("", [])]
    depth = 0
    for tok in toks:
        depth += (tok == "(") - (tok == ")")
        if depth == 0 and tok.upper() in words:
            parts.append((tok.upper(), []))
        else:
            parts[-1][1].append(tok)
    return parts


def items(toks: list[str]) -> list[list[str]]:
    """Comma-separated items outside parentheses."""
    return [part for _, part in split_top(toks, ",")]


def literal(tok: str) -> str:
    assert tok.startswith("'") and tok.endswith("'"), tok
    return tok[1:-1].replace("''", "'")


def outputs(expr: list[str]) -> set[str]:
    """The states an expression can give: a literal, a parameter, a kept state, or each
    result of a CASE."""
    expr = [t for t in expr if not t.startswith("::")]  # casts
    if expr and expr[0].upper() == "CASE":
        assert expr[-1].upper() == "END", expr
        found: set[str] = set()
        results: list[list[str]] = []
        depth = nesting = 0
        for tok in expr[1:-1]:
            depth += (tok == "(") - (tok == ")")
            word = tok.upper() if depth == 0 else ""
            nesting += (word == "CASE") - (word == "END")
            if nesting == 0 and word in ("WHEN", "THEN", "ELSE"):
                results.append([])
                if word == "WHEN":
                    results[-1] = ["<condition>"]
            elif results:
                results[-1].append(tok)
        for result in results:
            if result[:1] != ["<condition>"]:
                found |= outputs(result)
        return found
    if len(expr) == 1 and expr[0].startswith("'"):
        return {literal(expr[0])}
    if len(expr) == 1 and re.fullmatch(r"\$\d+|:\w+", expr[0]):
        return {PARAM}
    if expr[-1].lower() == "state" and (len(expr) == 1 or expr[-2] == "."):
        return {KEPT}
    raise AssertionError(f"cannot tell the states of {' '.join(expr)}")


def guards(where: list[str], names: set[str]) -> tuple[frozenset[str] | None, frozenset[str]]:
    """The state predicates among the WHERE's top-level conditions on the written row."""
    allowed: frozenset[str] | None = None
    excluded: set[str] = set()
    for _, cond in split_top(where, "AND"):
        if len(cond) >= 3 and cond[1] == "." and cond[0] in names:
            cond = cond[2:]
        if not cond or cond[0].lower() != "state":
            continue
        if cond[1] in ("=", "<>"):  # state = 'x', state <> 'x'
            values = {literal(cond[2])}
            negative = cond[1] == "<>"
        else:  # state IN ('x', 'y'), state NOT IN ('x', 'y')
            negative = cond[1].upper() == "NOT"
            start = cond.index("(")
            values = {literal(t) for t in cond[start + 1 : -1] if t != ","}
        if negative:
            excluded |= values
        else:
            allowed = frozenset(values) if allowed is None else allowed & values
    return allowed, frozenset(excluded)


def writes(name: str, sql: str, defaults: dict[Table, str]) -> Iterator[Write]:
    """Every write of a state table in one statement."""
    text = _COMMENT.sub(" ", sql)
    for head in _HEAD.finditer(text):
        table = Table(head["table"])
        op = head["op"].split()[0].lower()
        names = {table.value} | ({head["alias"]} if head["alias"] else set())
        body = until_close(tokens(text[head.end() :]))
        if op == "insert":
            close = until_close(body[1:])
            columns = [t.lower() for t in close if t != ","]
            rest = body[len(close) + 2 :]
            if "state" not in columns:
                targets: set[str | None] = {defaults[table]}
            else:
                keyword, values = rest[0].upper(), rest[1:]
                if keyword == "VALUES":
                    values = until_close(values[1:])
                else:
                    assert keyword == "SELECT", rest
                    values = split_top(values, "FROM")[0][1]
                targets = set(outputs(items(values)[columns.index("state")]))
            yield Write(name, table, op, frozenset(targets), None, frozenset())
            continue
        parts = dict(split_top(body, "SET", "FROM", "USING", "WHERE", "RETURNING"))
        if op == "update":
            assigned = [i for i in items(parts.get("SET", [])) if i[0].lower() == "state"]
            if not assigned:
                continue  # a write of other columns
            targets = set(outputs(assigned[0][2:])) - {KEPT}
        else:
            targets = {None}
        allowed, excluded = guards(parts.get("WHERE", []), names)
        yield Write(name, table, op, frozenset(targets), allowed, excluded)


def column_rules() -> tuple[dict[Table, set[str]], dict[Table, str]]:
    """Each state column's CHECK values and its default, from the migrations."""
    checks: dict[Table, set[str]] = {}
    defaults: dict[Table, str] = {}
    text = "\n".join(m.sql for m in _loader.MIGRATIONS)
    assert not re.search(r"ALTER\s+COLUMN\s+state\b", text, re.IGNORECASE)
    for table in Table:
        body = re.search(rf"CREATE TABLE __schema__\.{table.value} \((.*?)\n\);", text, re.DOTALL)
        assert body, table
        column = re.search(
            r"^\s*state\s+text\b(?P<decl>.*?)CHECK \(state IN \((?P<values>[^)]*)\)\)",
            body[1],
            re.DOTALL | re.MULTILINE,
        )
        assert column, table
        checks[table] = {literal(v.strip()) for v in column["values"].split(",")}
        default = re.search(r"DEFAULT ('\w+')", column["decl"])
        if default:
            defaults[table] = literal(default[1])
    # A later migration that widens a vocabulary replaces the constraint.
    replaced = re.findall(
        r"ALTER TABLE __schema__\.(\w+) ADD CONSTRAINT \w+\s+CHECK \(state IN \(([^)]*)\)\)",
        text,
    )
    for table_name, values in replaced:
        checks[Table(table_name)] = {literal(v.strip()) for v in values.split(",")}
    assert len(re.findall(r"CHECK \(state IN", text)) == len(Table) + len(replaced)
    return checks, defaults


CHECKS, DEFAULTS = column_rules()
NAMES = sorted(_loader.parse_folder(resources.files("cyclone._storage").joinpath("sql")))
QUERIES = _loader.Queries("states_test")
WRITES = [w for name in NAMES for w in writes(name, QUERIES[name], DEFAULTS)]


def op_of(t: Transition) -> str:
    return "insert" if not t.source else "delete" if t.target is None else "update"


def matches(w: Write, t: Transition) -> bool:
    return (w.statement, w.table, w.op) == (t.statement, t.table, op_of(t)) and (
        t.target in w.targets or PARAM in w.targets
    )


def test_the_enums_are_the_check_constraints() -> None:
    assert {table: set(states) for table, states in STATES.items()} == CHECKS


def test_a_reported_node_state_is_a_stored_one_or_says_where_its_task_is() -> None:
    # run_nodes passes a node's stored state through unless it is queued, and a job's run
    # state; the rest it computes as literals.
    reported = set(ReportedNodeState)
    assert set(NodeState) - {NodeState.QUEUED} <= reported
    assert reported >= STORED_RUN_STATES
    computed = re.findall(r"\b(?:THEN|ELSE)\s+'(\w+)'", QUERIES["run_nodes"])
    assert computed and set(computed) <= reported


def test_the_parser_sees_the_writes_it_must() -> None:
    # A sample of what the SQL says, so that a parser that sees nothing cannot pass.
    by_key = {(w.statement, w.table, w.op): w for w in WRITES}
    claim = by_key["task_claim", Table.TASKS, "update"]
    assert claim.targets == {"running"}
    cancel = by_key["run_cancel", Table.RUNS, "update"]
    assert (cancel.targets, cancel.guard_in) == ({"cancelled"}, {"pending", "failed"})
    assert by_key["run_cancel", Table.NODES, "update"].guard_not == {
        "completed",
        "failed",
        "skipped",
    }
    # workflow_insert writes nodes twice: the run's nodes, then the items of its root maps.
    submitted = [
        w
        for w in WRITES
        if (w.statement, w.table, w.op) == ("workflow_insert", Table.NODES, "insert")
    ]
    assert submitted[0].targets == {"pending", "waiting", "queued"}
    assert by_key["node_advance", Table.RUNS, "update"].targets == {"completed"}
    assert by_key["job_end", Table.RUNS, "update"].targets == {PARAM}
    assert ("task_heartbeat", Table.TASKS, "update") not in by_key  # its lease only
    assert len(WRITES) > 40


@pytest.mark.parametrize("write", WRITES, ids=lambda w: f"{w.statement}-{w.table}-{w.op}")
def test_every_write_is_a_listed_transition(write: Write) -> None:
    for target in write.targets:
        assert target is None or target == PARAM or target in STATES[write.table], target
        listed = [
            t
            for t in TRANSITIONS
            if (t.statement, t.table, op_of(t)) == (write.statement, write.table, write.op)
            and (target == PARAM or t.target == target)
        ]
        assert listed, f"{write.statement} writes {write.table} {target}: not in TRANSITIONS"


@pytest.mark.parametrize("transition", TRANSITIONS, ids=lambda t: f"{t.statement}-{t.target}")
def test_every_listed_transition_is_a_write(transition: Transition) -> None:
    assert transition.statement in NAMES
    states = STATES[transition.table]
    assert transition.source <= states and transition.target in (*states, None)
    assert any(matches(w, transition) for w in WRITES), (
        f"{transition.statement} does not write {transition.table} {transition.target}"
    )


@pytest.mark.parametrize(
    "write",
    [w for w in WRITES if w.guard_in is not None or w.guard_not],
    ids=lambda w: f"{w.statement}-{w.table}-{w.op}",
)
def test_a_guarded_write_starts_from_the_listed_states(write: Write) -> None:
    sources = set().union(*(t.source for t in TRANSITIONS if matches(write, t)))
    if write.guard_in is not None:
        assert sources == write.guard_in
    assert not sources & write.guard_not


def test_no_transition_is_listed_twice() -> None:
    keys = [(t.table, t.statement, t.source, t.target) for t in TRANSITIONS]
    assert len(keys) == len(set(keys))


def test_named_parameters_read_the_same() -> None:
    # The statements may name their parameters (:state) rather than number them ($2).
    for name in NAMES:
        named = re.sub(r"\$(\d+)", r":p\1", QUERIES[name])
        assert list(writes(name, named, DEFAULTS)) == list(writes(name, QUERIES[name], DEFAULTS))


def test_an_unlisted_write_is_seen() -> None:
    sql = """WITH x AS (
        UPDATE "s".cyclone_runs r SET finished_at = now(), state = 'failed'
        WHERE r.id = $1 AND r.state IN ('completed') AND (state = 'pending' OR true)
        RETURNING r.id
    ) DELETE FROM "s".cyclone_tasks WHERE run_id = :run_id"""
    update, delete = writes("made_up", sql, DEFAULTS)
    assert (update.table, update.targets, update.guard_in) == (
        Table.RUNS,
        {"failed"},
        {"completed"},
    )
    assert (delete.table, delete.op, delete.targets) == (Table.TASKS, "delete", {None})
    with pytest.raises(AssertionError, match="not in TRANSITIONS"):
        test_every_write_is_a_listed_transition(update)


def state_table() -> str:
    """TRANSITIONS as the Markdown table of docs/architecture.md: one row per transition,
    the statements that make it together."""
    rows: dict[tuple[object, ...], list[str]] = {}
    for t in TRANSITIONS:
        source = ", ".join(sorted(t.source)) or "(new)"
        key = (t.table.value, source, t.target or "(deleted)", t.guard, t.caller)
        rows.setdefault(key, []).append(f"`{t.statement}`")
    lines = [
        "| table | from | to | statement | guard | called by |",
        "|---|---|---|---|---|---|",
    ]
    for (table, source, target, guard, caller), statements in rows.items():
        lines.append(
            f"| {table} | {source} | {target} | {', '.join(statements)} | {guard} | {caller} |"
        )
    return "\n".join(lines) + "\n"


def test_the_docs_show_the_state_table() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert state_table() in page, "docs/architecture.md: paste tests/unit/test_states.state_table()"
