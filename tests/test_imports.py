"""The house's import graph: no cycle inside `cookbook/`, and data flowing downstream as docs/architecture.md says.

The graph is read from the source with `ast`, so an import hidden in a function body or under `TYPE_CHECKING`
counts as much as one at the top: a cycle that only a function-local import keeps from failing at start-up is
still two modules that each need the other. Importing a module from outside its package also runs the package's
`__init__`, so that counts as an import of the package; and a module that imports by name at run time
(`importlib.import_module`, as the check registry and the CLI do) imports every sibling module it names in a
string.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "cookbook"
ROOT = Path(__file__).resolve().parents[1]


def _modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package's __init__)."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _absolute(module: str, is_package: bool, target: str | None, level: int) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _owner(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """The package module a dotted name lives in (`cookbook.checks.CHECKS` -> `cookbook.checks`), None if outside."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _named_imports(module: str, is_package: bool, tree: ast.Module, modules: dict[str, tuple[Path, bool]]) -> set[str]:
    names: set[str] = set()
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.module, node.level)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module"):
            dynamic = True
    if dynamic:  # the module names what it imports in strings, relative to its own package
        package = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                if node.value != "__main__" and f"{package}.{node.value}" in modules:
                    names.add(f"{package}.{node.value}")
    return names


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the package's modules it imports (itself excluded unless it names itself)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        edges: set[str] = set()
        for name in _named_imports(module, is_package, ast.parse(path.read_text(), filename=str(path)), modules):
            target = _owner(name, modules)
            if target is None or (target == module and name == module):
                continue
            edges.add(target)
            # Importing a.b.c from outside a.b runs a.b's __init__ first (the root package's is a docstring).
            parent = target.rpartition(".")[0]
            while parent and parent != PACKAGE and not module.startswith(parent + ".") and module != parent:
                edges.add(parent)
                parent = parent.rpartition(".")[0]
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module, and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graph is a few dozen modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_no_import_cycle_inside_the_package() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in cookbook/: " + " | ".join(describe(c, graph) for c in found)
