"""The package's shape, read from its source with ``ast``: the layers its folders are, no
import cycle among Cyclone's modules, no module reaching into another object's private
members, and no module (or SQL file) too long to read at once.

Imports are counted wherever they stand: at module level, inside functions (the lazy imports
of optional extras) and under ``if TYPE_CHECKING:`` (a name a type checker follows is a
dependency a reader follows too).

A private member is an underscore name that is not a dunder. Code may use its own (``self._x``,
``cls._x``) and private modules (``cyclone._storage.queries``); everything else goes through
names without an underscore: what a client is made of is its ``services``, which it hands to
what it builds. A third-party object's private member that Cyclone cannot do without
is allowed only through :data:`ALLOWED`, each with the reason.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).parents[2] / "cyclone"

# (module, expression) pairs allowed to read a private member, with why.
ALLOWED = {
    # asyncpg keeps a pool's connect arguments only here: the LISTEN connection and the
    # pooler check open connections of their own to where the pool goes, and the start-up
    # check names that address when nothing answers there.
    ("cyclone._services.notifier", "pool._connect_args"),
    ("cyclone._services.notifier", "pool._connect_kwargs"),
    ("cyclone._services.pooler", "pool._connect_kwargs"),
    ("cyclone._services.readiness", "pool._connect_args"),
    ("cyclone._services.readiness", "pool._connect_kwargs"),
    # Django's connection proxy names the wrapper it stands for only through these.
    ("cyclone.integrations.django.connection", "source._connections"),
    ("cyclone.integrations.django.connection", "source._alias"),
    # The documented way to exit without joining threads: a handler thread past the
    # shutdown deadline cannot be stopped, and the interpreter would wait for it.
    ("cyclone.cli._worker", "os._exit"),
    # A named tuple's own API: SplitResult._replace.
    ("cyclone.testing._postgres", "urlsplit(self.dsn)._replace"),
    ("cyclone.testing._citus", "urlsplit(dsn)._replace"),
}


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return found


MODULES = _modules()


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in (
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (its ``else`` counts)."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if _type_checking(node):
            assert isinstance(node, ast.If)
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found


def _imports(name: str, tree: ast.Module, *, typing_too: bool = False) -> set[str]:
    """The Cyclone modules that module ``name`` imports, anywhere in it (with
    ``typing_too``, under ``if TYPE_CHECKING:`` as well)."""
    package = (
        name
        if (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()
        else (name.rpartition(".")[0])
    )
    found = set()
    for node in ast.walk(tree) if typing_too else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.add(f"{base}.{alias.name}")
                elif base in MODULES:
                    found.add(base)
    found.discard(name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, as the modules along it, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            if (found := visit(target)) is not None:
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        if (found := visit(module)) is not None:
            return found
    return None


@pytest.mark.parametrize("typing_too", [False, True], ids=["at run time", "type checking too"])
def test_the_import_graph_has_no_cycle(typing_too: bool) -> None:
    # The package imports its modules to re-export them; they import nothing back from it
    # (the package's public names come from the modules that define them).
    graph = {name: _imports(name, tree, typing_too=typing_too) for name, tree in MODULES.items()}
    assert "cyclone" not in set().union(*(graph[n] for n in graph if n != "cyclone"))
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def _private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def _reaches() -> list[str]:
    found = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if (name, ast.unparse(node)) not in ALLOWED:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_uses_another_objects_private_members() -> None:
    assert _reaches() == []


@pytest.mark.parametrize("allowed", sorted(ALLOWED))
def test_every_allowed_private_use_is_still_there(allowed: tuple[str, str]) -> None:
    module, expression = allowed
    used = {ast.unparse(n) for n in ast.walk(MODULES[module]) if isinstance(n, ast.Attribute)}
    assert expression in used, f"{module} no longer uses {expression}: drop it from ALLOWED"


# A module a reader can hold in mind at once. The SQL files follow the same rule.
MAX_LINES = 400


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.rglob("*.sql")))
def test_every_module_is_short(path: pathlib.Path) -> None:
    lines = len(path.read_text().splitlines())
    where = path.relative_to(PACKAGE.parent)
    assert lines <= MAX_LINES, f"{where} has {lines} lines: split it by what its parts do"


# The layers, lowest first: a module imports from its own layer and the ones below it, type
# checking's imports included. Whatever is in none of them (the facade, cyclone.sync, the
# exporters, the CLI, the dashboard, the integrations, the test kit) is above them all.
LAYERS = ["cyclone._model", "cyclone._storage", "cyclone._services", "cyclone._enqueue",
          "cyclone._worker"]  # fmt: skip
TOP = len(LAYERS)


def _layer(module: str) -> int:
    for rank, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return TOP


def _edges(*, typing_too: bool) -> set[tuple[str, str]]:
    return {
        (name, target)
        for name, tree in MODULES.items()
        for target in _imports(name, tree, typing_too=typing_too)
    }


def test_every_module_imports_only_from_its_layer_and_below() -> None:
    # What a lower layer needs of a higher one is a protocol of its own: a definition is given
    # a ``cyclone._model.ports.ClientPort``, a handle a ``RunsClient``, a worker a
    # ``cyclone._worker.ports.WorkerClient``; ``cyclone.Client`` is all of them, and each
    # reads the client's public ``services``.
    upward = {(a, b) for a, b in _edges(typing_too=True) if _layer(b) > _layer(a)}
    assert sorted(upward) == []


def test_no_layer_below_the_facade_names_the_client() -> None:
    named = {(a, b) for a, b in _edges(typing_too=True) if b == "cyclone._client"}
    assert sorted(a for a, _ in named if _layer(a) < TOP) == []


def test_the_core_never_imports_an_integration() -> None:
    # Integrations lend the core an Adapter (cyclone._enqueue.adapters), found through
    # entry points; the core never names them.
    core = [(a, b) for a, b in _edges(typing_too=True) if b.startswith("cyclone.integrations")]
    users = ("cyclone.integrations", "cyclone.testing", "cyclone.web", "cyclone.cli")
    assert [(a, b) for a, b in core if not a.startswith(users)] == []


def test_each_private_module_belongs_to_a_layer() -> None:
    # At the top: the package, the facade, the synchronous client, the exporters, the CLI
    # entry point and the extras' folders.
    top = {"cyclone", "cyclone.__main__", "cyclone._client", "cyclone.sync", "cyclone.otel",
           "cyclone.prometheus"}  # fmt: skip
    extras = ("cyclone.cli", "cyclone.web", "cyclone.integrations", "cyclone.testing")
    stray = [m for m in MODULES if _layer(m) == TOP and m not in top and not m.startswith(extras)]
    assert stray == []
