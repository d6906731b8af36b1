"""The package has no import cycles, at module level or through imports inside functions.

A function-level ("lazy") import only hides a cycle from the interpreter at import time: the two
modules still depend on each other. The graph below is built from the AST of every module with
*every* import statement, wherever it is. (The registry's ``load_builtins``/``load_plugins`` import
option modules by name through ``importlib``: that is the plugin mechanism — the registry itself
imports nothing of the bench — and those modules import the registry, never the other way round.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import prorl_bench

PKG = Path(list(prorl_bench.__path__)[0])


def _imports(path: Path, module_level_only: bool = False) -> set[str]:
    """The ``prorl_bench`` modules ``path`` imports (every import statement, or the top level only)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    deps: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path.name}: relative import (the graph expects absolute prorl_bench imports)")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("prorl_bench"):
            if node.module == "prorl_bench":  # from prorl_bench import stats
                deps.update(f"prorl_bench.{a.name}" for a in node.names if (PKG / f"{a.name}.py").exists())
            else:
                deps.add(node.module)
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name.startswith("prorl_bench."))
    return deps


def _graph(module_level_only: bool = False) -> dict[str, set[str]]:
    mods = sorted(p for p in PKG.glob("*.py") if p.stem != "__init__")
    return {f"prorl_bench.{p.stem}": _imports(p, module_level_only) - {f"prorl_bench.{p.stem}"} for p in mods}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_cycle_detector_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_imports_inside_functions(tmp_path, monkeypatch):
    """A lazy import is an edge: the detector must see the one hidden in a function body."""
    src = tmp_path / "mod.py"
    src.write_text("import os\n\n\ndef f():\n    from prorl_bench.config import Config\n    return Config\n")
    assert _imports(src) == {"prorl_bench.config"}
    assert _imports(src, module_level_only=True) == set()


def test_no_module_level_import_cycles():
    assert _cycles(_graph(module_level_only=True)) == []


def test_no_import_cycles_through_function_level_imports():
    assert _cycles(_graph()) == []
