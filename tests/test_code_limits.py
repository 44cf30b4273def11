"""Issue 32: no function of the page (``app.py``, ``page/``) or the figures (``viz/``) takes more than six parameters
(``self`` / ``cls`` not counted, ``*args`` / ``**kwargs`` counted) or runs over 50 lines, and ``app.py`` stays the
Space's entry point and little else."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_PARAMS, MAX_LINES, MAX_APP_LINES = 6, 50, 300


def functions(path: Path):
    """(name, line, parameters, lines) of every function in ``path``, nested ones included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            params = len(names) - (names[:1] in (["self"], ["cls"])) + (a.vararg is not None) + (a.kwarg is not None)
            yield node.name, node.lineno, params, node.end_lineno - node.lineno + 1


def test_page_and_figures_keep_functions_small():
    files = [ROOT / "app.py", *sorted((ROOT / "page").glob("*.py")), *sorted((ROOT / "viz").glob("*.py"))]
    over = [f"{path.relative_to(ROOT)}:{line} {name}: {params} parameters, {lines} lines"
            for path in files for name, line, params, lines in functions(path)
            if params > MAX_PARAMS or lines > MAX_LINES]
    assert not over, "\n".join(over)
    assert len((ROOT / "app.py").read_text(encoding="utf-8").splitlines()) <= MAX_APP_LINES
