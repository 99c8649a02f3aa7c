"""The house's rules, as docs/design.md draws them: imports point down, backends stand
alone, no module imports itself back through another.

Read from the source with ``ast``: every import counts, at module level or inside a
function, except those under ``if TYPE_CHECKING:`` (they are never executed).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "durablesched"

#: Lowest first. A module may import modules of its own layer or of a lower one.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "core",
        (
            "errors",
            "states",
            "records",
            "clock",
            "readable",
            "retry",
            "queues",
            "registry",
            "submission",
            "schedules",
            "attempts",
            "totals",
            "tracing",
        ),
    ),
    ("storage boundary", ("store.protocol", "store.durability")),
    ("public API", ("waiting", "handles", "scheduler", "context", "workflows")),
    ("backends", ("store.memory", "store.memory_workflows", "store.sql")),
    ("store tools", ("store.opening", "store.move", "store")),
    ("worker", ("worker",)),
    ("testing helpers", ("testing",)),
    ("metrics", ("metrics",)),
    ("tracing with OpenTelemetry", ("otel",)),
    ("dashboard", ("dashboard",)),
    ("command line", ("cli",)),
    ("integrations", ("contrib",)),
    ("facade", ("__init__", "__main__")),
]

#: (importer prefix, imported prefix) pairs that are forbidden even though they point down.
FORBIDDEN: list[tuple[str, str, str]] = [
    ("store.memory", "store.sql", "no backend imports another backend"),
    ("store.sql.sqlite", "store.sql.postgres", "no backend imports another backend"),
    ("store.sql.postgres", "store.sql.sqlite", "no backend imports another backend"),
    ("store.sql.postgres", "store.sql.inotify", "inotify is SQLite's file watcher"),
    ("worker", "store.sql", "the worker speaks to the Store protocol, not a backend"),
    ("worker", "store.memory", "the worker speaks to the Store protocol, not a backend"),
    ("worker", "store.opening", "the worker is handed a store; it does not open one"),
    ("__init__", "contrib", "an integration is imported by its users only, never by the core"),
    ("__init__", "metrics", "prometheus_client is an optional extra: imported on demand only"),
    ("__main__", "metrics", "prometheus_client is an optional extra: imported on demand only"),
    ("__init__", "otel", "OpenTelemetry is an optional extra: its users import durablesched.otel"),
    ("__main__", "otel", "OpenTelemetry is an optional extra: its users import durablesched.otel"),
    ("cli", "otel", "OpenTelemetry is an optional extra: its users import durablesched.otel"),
    ("__main__", "contrib", "an integration is imported by its users only, never by the core"),
    ("__init__", "dashboard", "the dashboard is an optional extra: imported on demand only"),
    ("__main__", "dashboard", "the dashboard is an optional extra: imported on demand only"),
    ("dashboard", "store.sql", "the dashboard speaks to the store protocols, not a backend"),
    ("dashboard", "store.memory", "the dashboard speaks to the store protocols, not a backend"),
]
#: The dialect-neutral SQL modules: none of them imports a database's own module.
NEUTRAL_SQL_IMPORTS_NO = ("store.sql.sqlite", "store.sql.postgres", "store.sql.inotify")
DATABASE_MODULES = ("store.sql.sqlite", "store.sql.postgres", "store.sql.inotify")

#: Third-party packages a module must not import at run time, and why.
NO_THIRD_PARTY: list[tuple[tuple[str, ...], str, str]] = [
    (
        (
            "errors",
            "states",
            "records",
            "clock",
            "retry",
            "queues",
            "registry",
            "submission",
            "schedules",
        ),
        "sqlalchemy",
        "the core runs without a database library",
    ),
    (
        ("store.protocol", "store.durability", "scheduler", "context", "handles", "waiting"),
        "sqlalchemy",
        "core",
    ),
    (("store.memory",), "sqlalchemy", "the in-memory backend needs no SQL"),
    (("worker",), "sqlalchemy", "the worker speaks to the Store protocol"),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every absolute module name imported by ``tree`` (relative imports resolved)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (
                name for child in node.orelse for name in _imports(child, module, is_package)
            )
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(["durablesched", *[b for b in base if b != "__init__"]])
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            yield target
            # `from durablesched.store.sql import sqlite` imports a module too.
            yield from (f"{target}.{alias.name}" for alias in node.names)
        else:
            yield from _imports(node, module, is_package)


def _graph() -> dict[str, set[str]]:
    """Module -> the durablesched modules it imports (names relative to the package)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for imported in _imports(tree, name, path.name == "__init__.py"):
            if imported == "durablesched":
                targets.add("__init__")
            elif imported.startswith("durablesched."):
                inner = imported.removeprefix("durablesched.")
                if inner in modules:
                    targets.add(inner)
        graph[name] = targets - {name}
    return graph


def _third_party(name: str) -> set[str]:
    path = _modules()[name]
    tree = ast.parse(path.read_text(), str(path))
    return {i.split(".")[0] for i in _imports(tree, name, path.name == "__init__.py")}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer(module: str) -> int:
    best: tuple[int, int] | None = None  # (length of the matching prefix, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _within(module, prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    assert best is not None, f"durablesched/{module} belongs to no layer: add it to LAYERS"
    return best[1]


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        _layer(module)


def test_imports_point_down() -> None:
    wrong = []
    for module, targets in _graph().items():
        for target in targets:
            if _within(module, "store") and target == "store":
                continue  # a package's modules may import its (empty) __init__
            if _layer(target) > _layer(module):
                wrong.append(
                    f"{module} ({LAYERS[_layer(module)][0]}) imports {target} "
                    f"({LAYERS[_layer(target)][0]})"
                )
    assert not wrong, "upward imports:\n" + "\n".join(sorted(wrong))


def test_backends_stand_alone() -> None:
    graph = _graph()
    wrong = []
    for module, targets in graph.items():
        for importer, imported, why in FORBIDDEN:
            wrong += [
                f"{module} imports {t}: {why}"
                for t in targets
                if _within(module, importer) and _within(t, imported)
            ]
        if _within(module, "store.sql") and not any(_within(module, d) for d in DATABASE_MODULES):
            wrong += [
                f"{module} is dialect-neutral but imports {t}"
                for t in targets
                if any(_within(t, d) for d in NEUTRAL_SQL_IMPORTS_NO)
            ]
    assert not wrong, "\n".join(sorted(wrong))


@pytest.mark.parametrize(("owners", "package", "why"), NO_THIRD_PARTY)
def test_modules_free_of_a_library(owners: tuple[str, ...], package: str, why: str) -> None:
    for module in _modules():
        if any(_within(module, owner) for owner in owners):
            assert package not in _third_party(module), f"{module} imports {package}: {why}"


def test_alembic_is_imported_by_the_migration_module_only() -> None:
    users = {m for m in _modules() if "alembic" in _third_party(m)}
    assert users <= {"store.sql.migrate"}, users


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    seen: dict[str, int] = {}  # 1 = on the stack, 2 = done
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for target in sorted(graph.get(node, ())):
            if seen.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in seen:
                visit(target, [*stack, target])
        seen[node] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module, [module])
    return cycles


def test_no_import_cycles() -> None:
    # Package __init__ files re-export their modules; an edge back to one is not a cycle.
    graph = {
        m: {t for t in ts if t == "__init__" or not _is_package_init(t)}
        for m, ts in _graph().items()
    }
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _is_package_init(module: str) -> bool:
    return (PACKAGE / module.replace(".", "/") / "__init__.py").exists()


def test_the_rules_see_a_violation() -> None:
    """The checker itself: a made-up upward import and a made-up cycle are found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    tree = ast.parse("from durablesched.cli import main\nif TYPE_CHECKING:\n    import x\n")
    assert set(_imports(tree, "errors", is_package=False)) == {
        "durablesched.cli",
        "durablesched.cli.main",
    }
    assert _layer("cli.main") > _layer("errors")


def test_opentelemetry_is_imported_by_the_otel_module_only() -> None:
    users = {m for m in _modules() if "opentelemetry" in _third_party(m)}
    assert users <= {"otel"}, users


def test_frameworks_are_imported_by_their_integration_only() -> None:
    users = {m for m in _modules() if "django" in _third_party(m)}
    assert users <= {m for m in _modules() if _within(m, "contrib.django")}, users
