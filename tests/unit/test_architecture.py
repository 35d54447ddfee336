"""The shape of the code, checked: the import graph of ``egress`` has no cycle (counting imports
under ``TYPE_CHECKING`` and inside functions, which Python hides until they run) and nothing
imports the package root; no class is over 500 lines; only the engines' own package asks which
engine it has. The layers themselves are import-linter's contract (``pyproject.toml``, ``make lint``)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

SOURCE = Path(__file__).resolve().parents[2] / "src" / "egress"
MAX_CLASS_LINES = 500
CONCRETE_ENGINES = {"SqliteEngine", "NatsEngine"}

# Imports that break the rules today in code being rewritten elsewhere; each entry goes once its
# module is rewritten (the test fails on an entry that no longer exists, so the list cannot go stale).
KNOWN_CYCLE_IMPORTS: set[tuple[str, str]] = set()
KNOWN_ROOT_IMPORTERS: set[str] = set()
KNOWN_LARGE_CLASSES: set[str] = set()
KNOWN_ENGINE_CHECKS: set[str] = set()


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("egress", include_external_packages=False, cache_dir=None)


def _cycles(graph: grimp.ImportGraph, ignored: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    edges = {module: sorted(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    for importer, imported in ignored:
        edges[importer] = [module for module in edges[importer] if module != imported]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            module, position = work.pop()
            if position == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            for next_position in range(position, len(edges[module])):
                target = edges[module][next_position]
                if target not in index:
                    work.append((module, next_position + 1))
                    work.append((target, 0))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
    return components


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return found


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    assert len(graph.modules) > 100  # the whole package was read
    for importer, imported in KNOWN_CYCLE_IMPORTS:
        assert graph.direct_import_exists(importer=importer, imported=imported), "a known import is gone: drop it"
    assert _cycles(graph, KNOWN_CYCLE_IMPORTS) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(module)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.d", imported="a.b")
    assert _cycles(graph, set()) == [["a.b", "a.c"]]
    assert _cycles(graph, {("a.c", "a.b")}) == []


def test_no_module_imports_the_package_root() -> None:
    importers = _graph().find_modules_that_directly_import("egress")
    assert importers == KNOWN_ROOT_IMPORTERS


def test_no_class_is_over_500_lines() -> None:
    large = {}
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    large[f"{module}.{node.name}"] = lines
    assert set(large) <= KNOWN_LARGE_CLASSES, large
    assert set(large) == KNOWN_LARGE_CLASSES, "a known large class was split: drop it from the list"


def test_only_the_engines_ask_which_engine_they_have() -> None:
    asking = {}
    for module, tree in _modules().items():
        if module.startswith("egress.engines"):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
                named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if named & CONCRETE_ENGINES:
                    asking.setdefault(module, []).append(node.lineno)
    assert set(asking) == KNOWN_ENGINE_CHECKS, asking
