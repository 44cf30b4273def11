"""The layers run one way: an AST scan of every module- and function-level import of the project's packages.

Layers, bottom to top (``LAYERS``): engine.core < engine.sources < engine.decoding < engine.product (itself
models < io < runs < bench) < viz < page | cli < app.  ``page`` and ``cli`` are siblings on one level: neither
imports the other.  A module may import its own layer and those below it, never one above nor a sibling; no two
modules import each other, directly or round a longer loop; plotly and gradio are imported only above the engine
(viz, page, cli, app).  pyproject.toml's import-linter contracts say the same (``lint-imports``, run by .ci/run);
this test needs nothing installed.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: bottom to top, each level one or more sibling layers; a module's layer is the longest prefix of its dotted name
LAYERS = (("engine",), ("engine.core",), ("engine.sources",), ("engine.decoding",),
          ("engine.product", "engine.product.models"), ("engine.product.io",), ("engine.product.runs",),
          ("engine.product.bench",), ("viz",), ("page", "cli"), ("app",))
OURS = ("engine", "viz", "page", "cli", "app")
FRONT_END = ("plotly", "gradio")  # libraries of the figures and the page: never below viz


def _modules() -> dict[str, Path]:
    found = {"app": ROOT / "app.py"}
    for package in ("engine", "viz", "page", "cli"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (module level, in functions, under TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] in OURS}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] in OURS:
                out |= {f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names}
    return {m for m in out if m != name}


def _home(name: str) -> tuple[int, str]:
    """(level, layer) of module ``name``: the longest layer prefix of its dotted name."""
    found = [(len(layer), i, layer) for i, level in enumerate(LAYERS) for layer in level
             if name == layer or name.startswith(layer + ".")]
    _, level, layer = max(found)
    return level, layer


def _layer(name: str) -> int:
    return _home(name)[0]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_module_imports_a_layer_above_it_or_a_sibling():
    wrong = [f"{name} ({_home(name)[1]}) imports {target} ({_home(target)[1]})"
             for name, targets in _graph().items() for target in sorted(targets)
             if _layer(target) > _layer(name) or (_layer(target) == _layer(name) and _home(target) != _home(name))]
    assert not wrong, "imports run up a layer or sideways:\n" + "\n".join(wrong)


def test_plotly_and_gradio_only_above_the_engine():
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            roots = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{name} imports {r}" for r in roots
                      if r.split(".")[0] in FRONT_END and _layer(name) < _layer("viz")]
    assert not found, "\n".join(found)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_modules_import_each_other():
    assert not _cycles(_graph()), f"import cycles: {_cycles(_graph())}"


@pytest.mark.parametrize("edges, cyclic", [({"a": {"b"}, "b": {"a"}}, True),
                                           ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
                                           ({"a": {"b"}, "b": {"c"}}, False)])
def test_the_cycle_check_finds_a_cycle(edges, cyclic):
    assert bool(_cycles(edges)) is cyclic


def test_the_scan_sees_function_level_and_relative_imports(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from ..product.bench import runner\n    from viz.charts import x\n")
    found = _imports("engine.decoding.mod", path, {"engine.product.bench.runner": path})
    assert found == {"engine.product.bench.runner", "viz.charts"}
    assert _layer("engine.product.bench.runner") > _layer("engine.decoding.mod")


def test_page_and_cli_are_siblings():
    assert _layer("page.generate") == _layer("cli.generate") and _home("page.generate") != _home("cli.generate")
    assert _layer("engine.product.runs.run") > _layer("engine.product.io.traces") > _layer("engine.product.models.x")


def test_the_scripts_import_names_that_exist():
    """``scripts/`` are run by hand, not by the suite: every project name they import must still exist (a module moved
    by a restructuring breaks them silently otherwise)."""
    import importlib

    missing = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in OURS:
                module = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and not _submodule(f"{node.module}.{a.name}")]
    assert not missing, "\n".join(missing)


def _submodule(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package
        return False
