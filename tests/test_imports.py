"""The package has no import cycles, and every import points down the layers (``LAYERS`` below,
lowest first: errors, searchpath -> registry -> config, extras -> models -> tasks -> rl -> run ->
engines -> sweeps | population -> cli), at module level or through imports inside functions.

A function-level ("lazy") import only hides a cycle from the interpreter at import time: the two
modules still depend on each other. The graph below is built from the AST of every module with
*every* import statement, wherever it is, and every string that names a bench module (a name handed
to ``importlib``, a list of modules to load): an import by name is an import. No module is exempt —
the registry imports nothing of the bench (the built-in options are declared by ``config`` and their
code registers itself where it lives). And at run time: importing ``prorl_bench.config`` and building
every config section loads no layer above it, torch or TRL (a fresh interpreter).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import prorl_bench

PKG = Path(list(prorl_bench.__path__)[0])
MODULE_NAME = re.compile(r"prorl_bench(\.\w+)+")


def _imports(path: Path, module_level_only: bool = False) -> set[str]:
    """The ``prorl_bench`` modules ``path`` imports (every import statement and every string naming a
    module, or the top level's import statements only)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    deps: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            name = node.value  # "prorl_bench.rl.kl", or a name inside one ("prorl_bench.rl.kl.k3"): its module
            while "." in name and _module_path(name) is None:
                name = name.rsplit(".", 1)[0]
            if "." in name:
                deps.add(name)
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path.name}: relative import (the graph expects absolute prorl_bench imports)")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("prorl_bench"):
            for a in node.names:  # from prorl_bench.sweeps import stats: the edge is to the module, not the package
                sub = _module_path(f"{node.module}.{a.name}")
                deps.add(f"{node.module}.{a.name}" if sub is not None else node.module)
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name.startswith("prorl_bench."))
    return deps


def _module_path(name: str) -> Path | None:
    """The file of module ``name`` (``prorl_bench.rl.kl`` -> rl/kl.py; a package -> its __init__.py), or None."""
    rel = PKG.joinpath(*name.split(".")[1:])
    for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG).with_suffix("").parts
    return ".".join(("prorl_bench", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _graph(module_level_only: bool = False) -> dict[str, set[str]]:
    mods = sorted(PKG.rglob("*.py"))
    return {_module_name(p): _imports(p, module_level_only) - {_module_name(p)} for p in mods}


def test_graph_covers_the_subpackages():
    graph = _graph()
    assert {"prorl_bench.rl.kl", "prorl_bench.run.trainer", "prorl_bench.tasks.base"} <= set(graph)
    assert "prorl_bench.rl.kl" in graph["prorl_bench.run.phases"] or any(
        "prorl_bench.rl" in d for d in graph["prorl_bench.run.phases"]
    )


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


def test_graph_sees_imports_by_name(tmp_path):
    """A module named by a string (importlib, a tuple of modules to load) is an edge; a string that
    names no module (an entry-point group) is not."""
    src = tmp_path / "mod.py"
    src.write_text(
        "import importlib\n\nMODULES = ('prorl_bench.rl.kl',)\nGROUP = 'prorl_bench.plugins'\n\n\n"
        "def load():\n    importlib.import_module('prorl_bench.tasks.base')\n"
    )
    assert _imports(src) == {"prorl_bench.rl.kl", "prorl_bench.tasks.base"}


def test_no_module_level_import_cycles():
    assert _cycles(_graph(module_level_only=True)) == []


def test_no_import_cycles_through_function_level_imports():
    assert _cycles(_graph()) == []


# The layers, lowest first. A module may import its own package and any package of a lower layer;
# packages of one layer are independent of each other (the applications at the top never import one
# another: their shared pieces live below them).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "searchpath"),  # leaves: NonFiniteError, where the YAML lives
    ("registry",),  # option registries, their params and metadata, plugins
    ("config", "extras"),  # the schema (with the study schema, metric names, TRL/verl names); pip extras
    ("models",),  # policies and everything that samples from them
    ("tasks",),  # tasks with verifiable rewards (they tokenize with models.tokenizers)
    ("rl",),  # the RL mathematics, references, resets, optimizer state
    ("run",),  # one run, start to finish (the trainer, its phases, export, records)
    ("engines",),  # other training engines (TRL) behind the same run directory
    ("sweeps", "population"),  # many runs: aggregation and studies; seed populations in lockstep
    ("cli",),  # the command-line entry points (prorl-bench, -sweep, -export, -sample)
)


def _layer(module: str) -> tuple[int, str] | None:
    """(layer index, top-level package) of a ``prorl_bench`` module; None for the package itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for i, names in enumerate(LAYERS):
        if parts[1] in names:
            return i, parts[1]
    raise AssertionError(f"{module}: prorl_bench.{parts[1]} is in no layer of LAYERS (add it where it belongs)")


def _violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every edge that does not point down: into a higher layer, or into another package of its own layer."""
    bad = []
    for m, deps in graph.items():
        src = _layer(m)
        for d in deps:
            dst = _layer(d)
            if src is None or dst is None or dst[1] == src[1]:
                continue
            if dst[0] >= src[0]:
                bad.append((m, d))
    return sorted(bad)


def test_every_package_has_a_layer():
    """A new subpackage must be placed in LAYERS (the order below) before it can be imported from."""
    tops = {
        p.stem if p.is_file() else p.name for p in PKG.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    tops -= {"__init__"}
    placed = {name for names in LAYERS for name in names}
    assert tops <= placed, f"packages without a layer: {sorted(tops - placed)}"


def test_layers():
    """Every import points down the layers (docs/design.md "Where things live"), at module level and
    inside functions: errors, searchpath -> registry -> config, extras -> models -> tasks -> rl -> run
    -> engines -> sweeps | population -> cli."""
    assert _violations({"prorl_bench.rl.kl": {"prorl_bench.run.guards"}}) == [
        ("prorl_bench.rl.kl", "prorl_bench.run.guards")
    ]
    assert _violations({"prorl_bench.sweeps.sweep": {"prorl_bench.population.runner"}}) != []  # one layer: independent
    assert _violations({"prorl_bench.cli.app": {"prorl_bench.run.trainer", "prorl_bench.cli.export"}}) == []
    assert _violations(_graph(module_level_only=True)) == []
    assert _violations(_graph()) == []


def test_config_validation_loads_no_higher_layer_torch_or_trl():
    """``import prorl_bench.config`` and building every config section — the root ``Config`` (which
    checks the task's prompt lengths against the model's context), each section with its defaults, and
    each section with every registered option of its axis selected — imports no layer above config, no
    torch and no TRL: the options' declarations are the config's, their code is not needed to validate.
    A fresh interpreter, so what other tests imported does not count."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import dataclasses, sys
        from prorl_bench import config
        from prorl_bench.config.options import SECTIONS
        root = config.Config()
        sections = [v for f in dataclasses.fields(root) if dataclasses.is_dataclass(v := getattr(root, f.name))]
        for value in sections:
            type(value)()
        # what an option needs besides its name to be valid in its section alone
        import os
        example = os.path.join(os.path.dirname(os.path.dirname(config.__file__)), "data", "math", "example.jsonl")
        needs = {"pattern": {"params": {"regex": "7$"}}, "hard": {"step": config.StepPolicy.reset},
                 "k1": {"placement": config.KLPlacement.reward}, "math_jsonl": {"params": {"path": example}}}
        built = 0
        for section, reg in SECTIONS.items():
            for name in reg.names():
                own = {"name": "X"} if section == "variant" else {}  # A0-C are presets of one reference each
                type(getattr(root, section))(**{reg.selector: name, **own, **needs.get(name, {})})
                built += 1
        lower = ("config", "registry", "errors", "searchpath", "extras")
        loaded = [m for m in sys.modules if m.split(".")[0] in ("torch", "trl", "transformers")
                  or (m.startswith("prorl_bench.") and m.split(".")[1] not in lower)]
        print(len(sections), built, sorted(loaded)[:5])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sections, built, loaded = proc.stdout.strip().split(" ", 2)
    assert int(sections) >= 20 and int(built) >= 30, proc.stdout
    assert loaded == "[]", f"validating a config loads: {loaded}"


def test_sweep_wrapper_and_aggregator_do_not_import_torch():
    """``prorl-bench-sweep`` (the parent of a multirun) and ``prorl-bench-aggregate`` read run
    directories only: importing torch there costs seconds per call (3 s on a loaded 2-core machine)
    for nothing. A fresh interpreter, so what other tests imported does not count."""
    import subprocess
    import sys

    code = (
        "import sys; import prorl_bench.cli.sweep, prorl_bench.sweeps.aggregate, prorl_bench.sweeps.plots; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"torch is imported by the sweep wrapper or the aggregator: {out}"
    # the wrapper itself tables only a failed or stopped sweep (a finished one is tabled by the
    # multirun's callback): the aggregator and scipy (0.9 s) are imported only then
    heavy = "('scipy', 'prorl_bench.sweeps.aggregate')"
    code = f"import sys, prorl_bench.cli.sweep; print([m for m in {heavy} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"the sweep wrapper imports the aggregator at start: {out}"


def test_a_training_process_does_not_import_the_aggregator():
    """Hydra instantiates ``hydra.callbacks`` in every process that runs a job (each single run, each
    sweep worker). The aggregation callback must not pull in pandas or scipy there: they cost about
    1.6 s of start-up per training process and only the multirun's end uses them. A fresh interpreter
    imports the CLI, composes the real config and instantiates its callbacks as Hydra does."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from hydra.utils import instantiate\n"
        "import prorl_bench.cli.app\n"
        "from prorl_bench.searchpath import CONF_DIR\n"
        "with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):\n"
        "    cfg = compose(config_name='config', return_hydra_config=True)\n"
        "cbs = [instantiate(c) for c in cfg.hydra.callbacks.values()]\n"
        "assert cbs and type(cbs[0]).__name__ == 'AggregateCallback', cbs\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'scipy', 'matplotlib'))[:3])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"a training process imports the aggregator's dependencies: {out.stdout}"
