"""The package has no import cycles at module level (lazy imports inside functions are allowed:
they break a cycle at import time on purpose and say why)."""

from __future__ import annotations

import ast
from pathlib import Path

import prorl_bench

PKG = Path(list(prorl_bench.__path__)[0])


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    deps: set[str] = set()
    for node in tree.body:  # module level only (not inside functions)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("prorl_bench"):
            if node.module == "prorl_bench":  # from prorl_bench import stats
                deps.update(f"prorl_bench.{a.name}" for a in node.names if (PKG / f"{a.name}.py").exists())
            else:
                deps.add(node.module)
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name.startswith("prorl_bench."))
    return deps


def _graph() -> dict[str, set[str]]:
    return {f"prorl_bench.{p.stem}": _top_level_imports(p) for p in PKG.glob("*.py") if p.stem != "__init__"}


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


def test_no_module_level_import_cycles():
    assert _cycles(_graph()) == []
