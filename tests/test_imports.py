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
            submodules = {f"{base}.{alias.name}" for alias in node.names} & set(modules)
            names.update(submodules)
            if len(submodules) < len(node.names):  # names from the module's own namespace, not only its submodules
                names.add(base)
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


def test_the_cycle_finder_sees_hidden_imports_and_package_inits(tmp_path: Path) -> None:
    """The graph counts what a cycle hides behind: a function-local import, a TYPE_CHECKING block, a package's
    __init__ that imports its submodules by name."""
    package = tmp_path / PACKAGE
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import X\n")
    (package / "high.py").write_text("def f():\n    from cookbook import low\n")
    (package / "inner" / "__init__.py").write_text(
        "import importlib\nfor n in ('leaf',):\n    importlib.import_module(f'{__name__}.{n}')\n")
    (package / "inner" / "leaf.py").write_text("from ..user import thing\n")
    (package / "user.py").write_text("from .inner.other import y\n")
    (package / "inner" / "other.py").write_text("y = 1\n")
    (package / "alone.py").write_text("from . import low\n")
    graph = import_graph(tmp_path)
    # user imports inner.other from outside inner, which runs inner's __init__, which imports leaf, which imports user
    assert sorted(cycles(graph)) == [["cookbook.high", "cookbook.low"], ["cookbook.inner", "cookbook.inner.leaf", "cookbook.user"]]
    assert graph["cookbook.alone"] == {"cookbook.low"}


# The layers of docs/architecture.md, lowest first. A module imports only modules of its own layer or below (an
# unlisted module of the package is the library, the lowest layer): data flows downstream, to the run folder, the
# notebooks' session and the reports, then the batch and the widgets, then the command line.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("library", ()),
    ("run folder", ("cookbook.run_folder",)),
    ("session and reports", ("cookbook.session", "cookbook.report", "cookbook.compare", "cookbook.plots")),
    ("batch and widgets", ("cookbook.batch", "cookbook.fleet", "cookbook.ui")),
    ("command line", ("cookbook.cli", "cookbook.__main__")),
]


def layer_of(module: str) -> int:
    for number, (_, members) in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return number
    return 0


def test_data_flows_downstream() -> None:
    graph = import_graph()
    upstream = sorted(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                      for module, targets in graph.items() for target in targets if layer_of(target) > layer_of(module))
    assert not upstream, "imports against the flow: " + "; ".join(upstream)


def _third_party(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the top-level names of what it imports from outside the package."""
    found: dict[str, set[str]] = {}
    for module, (path, _) in _modules(root).items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[module] = names - {PACKAGE}
    return found


def test_the_rules_the_code_keeps_on_imports() -> None:
    """docs/architecture.md: the cookbook's environment never imports vLLM; cookbook.ui is the only module that
    imports ipywidgets; the fix engine imports nothing from the cookbook."""
    imports = _third_party()
    assert [m for m, names in imports.items() if "vllm" in names] == []
    assert [m for m, names in imports.items() if "ipywidgets" in names] == ["cookbook.ui"]
    for path in sorted((ROOT / "fixes").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        named = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        named |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
        assert PACKAGE not in named, f"{path.relative_to(ROOT)} imports {PACKAGE}"
