"""The package's import graph: no cycle between modules and no import of another module's
``_private`` name, counting module-level and function-local imports alike. Edges into a package
``__init__`` are left out (a package re-exports its modules; importing it is not importing them)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hospitrust"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _resolve(module: str, level: int, current: str, is_package: bool) -> str:
    if not level:
        return module
    parts = current.split(".") if is_package else current.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package modules it imports, every 'module -> other._private' import)."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    private: list[str] = []
    for current, path in modules.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, current, path.name == "__init__.py")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append((sub, None) if sub in modules else (base, alias.name))
            for target, attr in targets:
                if not target.startswith("hospitrust"):
                    continue
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target == current or target not in modules:
                    continue
                if attr and attr.startswith("_") and not attr.startswith("__"):
                    private.append(f"{current} -> {target}.{attr}")
                if modules[target].name != "__init__.py":
                    out.add(target)
        edges[current] = out
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()[0]) == []


def test_no_import_of_another_modules_private_name():
    assert import_graph()[1] == []


def test_the_checker_sees_a_function_local_cycle():
    """The checker itself: a cycle through a function-local import counts."""
    edges = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(edges) == [["a", "b"]]
    graph, _ = import_graph()
    assert "hospitrust.server_app.loop" in graph and "hospitrust.fbd.server" in graph["hospitrust.server_app.loop"]


def test_the_flower_components_stay_components_whatever_was_imported_first():
    """``hospitrust.server_app:app`` and ``hospitrust.client_app:app`` are what Flower loads; a
    submodule named ``app`` would replace the package attribute once imported directly (it did:
    a test importing ``hospitrust.ops.inprocess`` first made ``server_app.app`` a module)."""
    import importlib

    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    importlib.import_module("hospitrust.server_app.serverapp")
    importlib.import_module("hospitrust.client_app.clientapp")
    assert isinstance(importlib.import_module("hospitrust.server_app").app, ServerApp)
    assert isinstance(importlib.import_module("hospitrust.client_app").app, ClientApp)
