"""Sizes the code is held to (architecture v5): every function of the package is at most 80 lines, so a
reader sees one idea per function; the run loop's stricter limits are in tests/run/test_trainer.py and the
sandbox package's module limit in tests/tasks/test_sandbox_v4.py."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGE = Path(next(iter(importlib.util.find_spec("prorl_bench").submodule_search_locations)))
MAX_FUNCTION_LINES = 80


def function_lengths(root: Path) -> dict[str, int]:
    """``module.py:function`` -> lines from its ``def`` to its last line, for every function and method."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[f"{path.relative_to(root)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_every_function_of_the_package_is_at_most_80_lines():
    lengths = function_lengths(PACKAGE)
    assert len(lengths) > 500  # the whole package was read, not an empty folder
    over = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def test_the_measure_counts_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert function_lengths(tmp_path) == {"m.py:long": 91, "m.py:short": 2}
