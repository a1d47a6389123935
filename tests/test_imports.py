"""The package's import graph: no cycle between modules, no cycle between packages, no lower layer
importing a higher one (the layers are declared below, as docs/architecture.md draws them), and no
import of another module's ``_private`` name, counting module-level and function-local imports
alike. Between modules, edges into a package ``__init__`` are left out (a package re-exports its
modules; importing it is not importing them); between packages every import counts."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hospitrust"

# Each subpackage (or top-level module) of hospitrust and its floor: a package imports only its own
# floor and the floors below it, and no two packages import each other. docs/architecture.md draws it.
CORE, LOWER, MIDDLE, TOP = 0, 1, 2, 3
LAYERS = {
    # the core: the Options base, errors, metric names, the private-state helpers, the typed round records, the
    # extras' check, the arrays' wire form
    "hospitrust": CORE, "options": CORE, "errors": CORE, "metrics": CORE, "private": CORE, "records": CORE,
    "extras": CORE, "wire": CORE,
    # math, data and models: pure rules, attacks, datasets and the server's data, tasks, models,
    # contribution math, privacy math, FED-FBD's block model; the environment checks
    "aggregation": LOWER, "attacks": LOWER, "datasets": LOWER, "tasks": LOWER, "models": LOWER,
    "contribution": LOWER, "privacy": LOWER, "fbd": LOWER, "envcheck": LOWER,
    # the round's parts and the run config composed from the options below
    "features": MIDDLE, "strategies": MIDDLE, "config": MIDDLE,
    # the Flower apps (FED-FBD's loop is the ServerApp's and the ClientApp's), the command line and
    # what it runs: grids, the in-process grid and simulate (ops), deployment (ops.deploy), the
    # console, the PKI, process supervision, the data check, benchmark grids
    "server_app": TOP, "client_app": TOP, "cli": TOP, "bench": TOP, "ops": TOP,
    "console": TOP, "pki": TOP, "supervision": TOP, "datacheck": TOP,
}


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


def package_of(module: str) -> str:
    """``hospitrust.server_app.loop`` -> ``server_app``; ``hospitrust.errors`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages it imports (any import, module-level or in a function,
    package ``__init__`` included)."""
    modules = _modules()
    out: dict[str, set[str]] = {package_of(m): set() for m in modules}
    for current, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = [_resolve(node.module or "", node.level, current, path.name == "__init__.py")]
            else:
                continue
            for target in targets:
                if target.split(".")[0] == "hospitrust" and package_of(target) != package_of(current):
                    out[package_of(current)].add(package_of(target))
    return out


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every 'lower -> higher' package import, with both floors."""
    return sorted(f"{a} (floor {layers[a]}) -> {b} (floor {layers[b]})"
                  for a, targets in graph.items() for b in targets if layers[a] < layers[b])


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


def test_every_package_has_a_declared_layer():
    """A new package takes a floor here (and in docs/architecture.md) before it is imported."""
    assert sorted(set(package_graph()) - set(LAYERS)) == []
    assert sorted(set(LAYERS) - set(package_graph())) == []


def test_no_import_cycle_between_packages():
    assert cycles(package_graph()) == []


def test_no_lower_layer_imports_a_higher_one():
    assert upward_imports(package_graph(), LAYERS) == []


def test_the_layer_check_sees_an_upward_and_a_package_cycle():
    """The checks themselves, on a made-up graph: a function-level import counts the same."""
    graph = {"options": set(), "config": {"server_app", "options"}, "server_app": {"config"}}
    layers = {"options": CORE, "config": MIDDLE, "server_app": TOP}
    assert upward_imports(graph, layers) == ["config (floor 2) -> server_app (floor 3)"]
    assert cycles(graph) == [["config", "server_app"]]
    real = package_graph()
    assert "fbd" in real["strategies"]  # strategies/fbd.py imports fbd's block model at module level
    assert "datasets" in real["envcheck"]  # a function-level import (envcheck.data_folder)


def test_no_import_of_another_modules_private_name():
    assert import_graph()[1] == []


def test_the_checker_sees_a_function_local_cycle():
    """The checker itself: a cycle through a function-local import counts."""
    edges = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(edges) == [["a", "b"]]
    graph, _ = import_graph()
    assert "hospitrust.cli.fbd" in graph and "hospitrust.strategies.fbd" in graph["hospitrust.cli.fbd"]  # imported in a function


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
