"""The layers run one way: an AST scan of every module- and function-level import of the project's packages.

Layers, bottom to top (``LAYERS``): engine.core < engine.sources < engine.decoding < engine.product < viz < page
< app.  A module may import its own layer and those below it, never one above; and no two modules import each
other, directly or round a longer loop.  pyproject.toml's import-linter contract says the same (``lint-imports``,
run by .ci/run); this test needs nothing installed.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: bottom to top; a module's layer is the longest prefix of its dotted name found here
LAYERS = ("engine", "engine.core", "engine.sources", "engine.decoding", "engine.product", "viz", "page", "app")
OURS = ("engine", "viz", "page", "app")


def _modules() -> dict[str, Path]:
    found = {"app": ROOT / "app.py"}
    for package in ("engine", "viz", "page"):
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


def _layer(name: str) -> int:
    return max(i for i, layer in enumerate(LAYERS) if name == layer or name.startswith(layer + "."))


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_module_imports_a_layer_above_it():
    upward = [f"{name} ({LAYERS[_layer(name)]}) imports {target} ({LAYERS[_layer(target)]})"
              for name, targets in _graph().items() for target in sorted(targets) if _layer(target) > _layer(name)]
    assert not upward, "imports run up a layer:\n" + "\n".join(upward)


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
    path.write_text("def f():\n    from ..product import bench\n    from viz.charts import x\n")
    found = _imports("engine.decoding.mod", path, {"engine.product.bench": path})
    assert found == {"engine.product.bench", "viz.charts"}
    assert _layer("engine.product.bench") > _layer("engine.decoding.mod")
