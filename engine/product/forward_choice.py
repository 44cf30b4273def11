"""The forward path chosen by measurement: eager, static or compiled (``engine.core.forward``), per model and device.

Like the precision (``precision.py``), the path that verifies trees fastest depends on the machine: a static cache
saves the growing cache's copies, a compiled forward saves the framework's per-op overhead where the model's
arithmetic is small beside it, and costs a compile first (tens of seconds to minutes per tree-size bucket on 2
cores).  ``choose`` with "auto" times T(1) and T(16) (an AR step and a typical tree, as the precision's choice
weighs them) of the eager and static paths, interleaved within each round, and keeps the lower sum; the result is
cached under ``$GOOSE_LENS_CACHE/forward``.  The compiled path is measured and chosen only when asked
(``--forward compiled``, or ``$GOOSE_LENS_FORWARD``) or when ``compiled=True``: compiling every bucket on a
visitor's page would hold the engine thread for minutes (docs/results.md, "The forward paths", has what each path
costs on this project's machines).

A compiled path keeps inductor's artifacts in the project's cache root (``$GOOSE_LENS_CACHE/inductor``, set as
``TORCHINDUCTOR_CACHE_DIR`` unless the caller set it: torch keys them by its version, the CPU and the graph), so a
warm start loads them.  A compile that fails (no C++ compiler, an op inductor refuses) logs one sentence and the
eager path serves: nothing is lost.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..core.forward import PATHS, EagerPath, ForwardPath, make_path, static_problem
from ..core.tree import DraftTree, Source
from .cost_cache import curve_key
from .paths import cache_root

log = logging.getLogger(__name__)

ENV = "GOOSE_LENS_FORWARD"  # auto | eager | static | compiled: the path every command and the page use
FORMAT = 1  # version of the cached choice file
TREE_ROWS = 16  # the tree size weighed beside one AR step (as precision.TREE_ROWS)
CHOICES = ("auto", *PATHS)


@dataclass(frozen=True)
class PathChoice:
    """The forward path a model runs, and why.

    Attributes:
        path: the ``ForwardPath`` (shared by the model's generations).
        reason: one sentence, e.g. "static: T(1) + T(16) 9 % below the eager path's here".
        ms: measured medians {path name: [T(1), T(16)]} in ms ({} when nothing was measured).
        compile_s: seconds the compiled path took to compile its measured buckets (0: not compiled).
    """

    path: ForwardPath
    reason: str
    ms: dict = field(default_factory=dict)
    compile_s: float = 0.0

    @property
    def name(self) -> str:
        return self.path.name


def compiler_problem() -> str | None:
    """Why ``torch.compile`` cannot build CPU code here (a sentence), or None: inductor's CPU backend needs a C++
    compiler (``$CXX`` or ``g++`` / ``clang++`` / ``c++`` on the PATH)."""
    if any(shutil.which(c) for c in filter(None, (os.environ.get("CXX"), "g++", "clang++", "c++"))):
        return None
    return "no C++ compiler is installed (torch.compile's CPU backend needs one: apt install g++)"


def use_cache_root(cache_dir: str | Path | None = None) -> None:
    """Keep inductor's compiled artifacts in the project's cache root (``TORCHINDUCTOR_CACHE_DIR``), unless set."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root(cache_dir) / "inductor"))


@torch.no_grad()
def measure(model, paths: dict[str, ForwardPath], sizes: tuple[int, ...] = (1, TREE_ROWS), past: int = 128,
            repeats: int = 7, first: dict | None = None) -> dict[str, list[float]]:
    """Median ms of one verification forward of each of ``sizes`` nodes (a chain) over ``past`` cached tokens and
    its argmax read-back (which waits for the device), per path, interleaved within each round; the first round
    warms up (and compiles or captures a path's buckets).  Returns {path name: [T(n) for n in sizes]}; ``first``,
    when given, gets {(path name, n): seconds of that first forward}."""
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (past,), generator=gen).tolist()
    forwards = {}
    for name, path in paths.items():
        forwards[name] = path.open(past + max(sizes) + 1, max(sizes))
        forwards[name].prefill(prefix)
    times: dict[tuple[str, int], list[float]] = {(name, n): [] for name in paths for n in sizes}
    for _ in range(repeats + 1):
        for (name, n), row in times.items():
            chain = DraftTree.chain(torch.randint(0, vocab, (n,), generator=gen).tolist(), Source.ROOT)
            t0 = time.perf_counter()
            forwards[name].verify(chain).argmax(-1).tolist()  # the read-back waits for the device
            row.append((time.perf_counter() - t0) * 1000)
            forwards[name].commit([])
    if first is not None:
        first.update({key: row[0] / 1000 for key, row in times.items()})
    return {name: [round(statistics.median(times[(name, n)][1:]), 3) for n in sizes] for name in paths}


def decide(ms: dict[str, list[float]]) -> tuple[str, str]:
    """(the path with the lowest T(1) + T(``TREE_ROWS``), the sentence that says why, against the eager path)."""
    best = min(ms, key=lambda name: sum(ms[name]))
    if best == "eager":
        return best, "eager: no other path verified trees faster here"
    gain = 1 - sum(ms[best]) / sum(ms["eager"])
    return best, (f"{best}: an AR step and a {TREE_ROWS}-node tree {gain:.0%} faster than the eager path here "
                  f"(T(1) {ms[best][0]:.1f} vs {ms['eager'][0]:.1f} ms)")


def _key(model) -> str:
    return f"{curve_key(model)}|{torch.get_num_threads()} threads|{os.cpu_count()} cpus"


def _cache_file(model, cache_dir: str | Path | None) -> Path:
    return cache_root(cache_dir) / "forward" / (hashlib.sha1(_key(model).encode()).hexdigest()[:16] + ".json")


def _compiled(model, cache_dir: str | Path | None) -> tuple[ForwardPath | None, str]:
    """The compiled path (its artifacts in the cache root), or (None, why not)."""
    problem = compiler_problem()
    if problem:
        return None, problem
    use_cache_root(cache_dir)
    try:
        return make_path(model, "compiled"), ""
    except Exception as exc:  # noqa: BLE001 - any refusal falls back, with its reason
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def choose(model, want: str | None = None, compiled: bool = False,
           cache_dir: str | Path | None = None) -> PathChoice:
    """The forward path for ``model``: ``want`` ("auto", "eager", "static", "compiled"; None reads
    ``$GOOSE_LENS_FORWARD``, default "auto").  "auto" measures the eager and static paths once per model and machine
    (cached; with ``compiled`` the compiled one too) and keeps the fastest; a path the model cannot run, or a compile
    that fails, falls back to the eager path, with the reason in the sentence.

    Raises:
        ValueError: ``want`` is not one of ``CHOICES``.
    """
    want = want or os.environ.get(ENV) or "auto"
    if want not in CHOICES:
        raise ValueError(f"unknown forward path {want!r}: one of {', '.join(CHOICES)}")
    eager = EagerPath(model)
    if want == "eager":
        return PathChoice(eager, "eager: as asked")
    problem = static_problem(model)
    if problem:
        return PathChoice(eager, f"eager: the static path cannot serve this model: {problem}")
    if want == "static":
        return PathChoice(make_path(model, "static"), "static: as asked")
    if want == "compiled" or compiled:
        return _choose_compiled(model, eager, want, cache_dir)
    file = _cache_file(model, cache_dir)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        if data.get("format") == FORMAT and data.get("key") == _key(model) and data.get("path") in ("eager", "static"):
            return PathChoice(make_path(model, data["path"]), data["reason"], data["ms"])
    except (OSError, ValueError, TypeError):
        pass
    ms = measure(model, {"eager": eager, "static": make_path(model, "static")})
    name, reason = decide(ms)
    log.info("forward path: %s", reason)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "key": _key(model), "path": name, "reason": reason, "ms": ms}),
                       encoding="utf-8")
        os.replace(tmp, file)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
    return PathChoice(eager if name == "eager" else make_path(model, name), reason, ms)


def _choose_compiled(model, eager: EagerPath, want: str, cache_dir: str | Path | None) -> PathChoice:
    """The compiled path, compiled now for 1 and ``TREE_ROWS`` rows and measured beside the others: kept where
    asked (``want`` "compiled") or where it is the fastest; the eager path, with one sentence, where it fails."""
    path, problem = _compiled(model, cache_dir)
    if path is None:
        log.warning("forward path: eager, since the compiled path cannot run here: %s", problem)
        return PathChoice(eager, f"eager: the compiled path cannot run here: {problem}")
    start = time.perf_counter()
    try:
        ms = measure(model, {"eager": eager, "static": make_path(model, "static"), "compiled": path})
    except Exception as exc:  # noqa: BLE001 - inductor's refusals take many forms; the eager path serves
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("forward path: eager, since compiling the forward failed: %s", why)
        return PathChoice(eager, f"eager: compiling the forward failed ({why[:160]})")
    took = time.perf_counter() - start
    name, reason = ("compiled", "compiled: as asked") if want == "compiled" else decide(ms)
    log.info("forward path: %s (compiled and measured in %.0f s; T(1), T(%d) in ms: %s)", reason, took, TREE_ROWS,
             ms)
    chosen = {"eager": eager, "compiled": path}.get(name) or make_path(model, name)
    return PathChoice(chosen, reason, ms, round(took, 1))
