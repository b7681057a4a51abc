"""The package's modules import one another without a circle.

A circle (a imports b, b imports a) makes the import order decide which
names exist, turns a change in one module into an import error in another,
and means neither module can be read or tested without the other; the
command line had one (cli.py and cli_ops.py) before it became the cli
package. Every import counts, at module level or inside a function (a lazy
import hides a circle from the import system, not from the reader); only
imports for type checkers (`if TYPE_CHECKING:`) do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python_client" / "runrelay"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` but those under `if TYPE_CHECKING:`."""
    nodes: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports. `from . import x` of a submodule x
    depends on x only: the package itself is then already being imported."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    deps: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
            continue
        if node.level:
            base = package.split(".")
            if node.level > 1:
                base = base[: -(node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        submodules = {f"{target}.{a.name}" for a in node.names} & modules.keys()
        deps.update(submodules)
        if target in modules and (node.module or len(submodules) < len(node.names)):
            deps.add(target)
    return deps - {name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_package_has_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph.get("runrelay.cli.main"), "the walk found no imports"
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
