"""The forward path chosen by measurement: eager, static or compiled (``engine.core.forward``), per model and machine.

Like the precision (``precision.py``), the path that verifies trees fastest depends on the machine: a static cache
saves the growing cache's copies, a compiled forward saves the framework's per-op overhead, and costs a compile
first (about 75 s per tree-size bucket on a 2-core CPU, 10-20 s per bucket from inductor's cache).  ``choose`` with
"auto" reads a cached measurement of T(1) and T(16) per path (an AR step and a typical tree, as the precision's
choice weighs them; interleaved within each round) and keeps the lowest sum; without one it times the eager and
static paths (seconds) and caches that.  The compiled path enters the measurement where an operator asks for it
once (``python scripts/forward_paths.py --choose``: it compiles two buckets, minutes on 2 cores); from then on
``auto`` keeps it where it was faster, compiling every bucket before the first run (``warm``), so no cycle waits for
a compile.  docs/results.md, "The forward paths", has what each path costs.

A compiled path keeps inductor's artifacts in the project's cache root (``$GOOSE_LENS_CACHE/inductor``, set as
``TORCHINDUCTOR_CACHE_DIR`` unless the caller set it: torch keys them by its version, the CPU and the graph), so a
warm start loads them.  A compile that fails (no C++ compiler, an op inductor refuses) logs one sentence and the
eager path serves: nothing is lost.
"""
from __future__ import annotations

import logging
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.core.forward import SPECS, ForwardPath, Longer, PathSpec, baseline, make_path, path_names, static_problem
from engine.core.tree import DraftTree, Source
from engine.decoding.cost import MAX_SPREAD
from engine.product.models.cost_cache import curve_key
from engine.product.models.paths import cache_root
from engine.product.models.timing import Timings, cache_file, read_cache, time_forwards, write_cache

log = logging.getLogger(__name__)

ENV = "GOOSE_LENS_FORWARD"  # auto | a registered path's name: the path every command and the page use
FORMAT = 6  # version of the cached choice file (2: the tree weighed is TREE_ROWS = 4 rows; 3: timed between AR
# steps, charged the step after it: ``timing.time_forwards``; 4: llama.cpp's paths with either KV cache; 5: the
# path for long generations, ``Longer``; 6: the fused paths measured too)
TREE_ROWS = 4  # the tree weighed beside one AR step: about the size GT keeps on a CPU, where rows cost arithmetic
# (16 weighed a tree GT rarely builds there; docs/results.md, "The forward paths")
CHOICES = ("auto", *path_names())  # every path (engine.core.forward.SPECS)
LONG = next(s for s in SPECS.values() if s.auto == "long")  # over a long context llama.cpp's attention without flash
# attention costs less than the flash-attention paths'
LONG_PATH = LONG.name
BASELINE = baseline().name  # the path every measurement is compared with (eager)
LONG_CELLS = 1024  # the cached tokens an AR step is timed over beside 128, for the long path's threshold (a long
# prompt's 1-2k tokens; its prefill costs ~2 s a path on 2 cores)
LONG_GAIN = 0.03  # the long path is kept where its AR step over ``LONG_CELLS`` costs at least this much less


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


def timings(model, paths: dict[str, ForwardPath], sizes: tuple[int, ...] = (1, TREE_ROWS), past: int = 128,
            repeats: int = 7) -> Timings:
    """Every timed round of one verification forward of each of ``sizes`` nodes (a chain) over ``past`` cached tokens,
    with the loop's read-back, per path, by the project's one timer (``timing.time_forwards``: pairs in a new order
    each round; the warm-up round compiles or captures a path's buckets, its seconds in ``first``)."""
    vocab = model.config.get_text_config().vocab_size
    prefix = torch.randint(0, vocab, (past,), generator=torch.Generator().manual_seed(0)).tolist()
    forwards = {}
    for name, path in paths.items():
        path.prepare(past + max(sizes) + 1, max(sizes))  # captures and compiles (graphed paths) before the timer
        forwards[name] = path.open(past + max(sizes) + 1, max(sizes))
        forwards[name].prefill(prefix)
    return time_forwards(forwards, tuple(sizes), vocab, model.device, repeats)


def measure(model, paths: dict[str, ForwardPath], sizes: tuple[int, ...] = (1, TREE_ROWS), past: int = 128,
            repeats: int = 7, first: dict | None = None) -> dict[str, list[float]]:
    """Median ms of one verification forward of each of ``sizes`` nodes per path (``timings``).  Returns {path name:
    [T(n) for n in sizes]}; ``first``, when given, gets {(path name, n): seconds of that first forward}."""
    timed = timings(model, paths, sizes, past, repeats)
    if first is not None:
        first.update(timed.first)
    return timed.medians(tuple(sizes))


def busy_problem(timed: Timings, sizes: tuple[int, ...] = (1, TREE_ROWS)) -> str | None:
    """Why a measurement of the paths looks taken on a busy machine (one sentence), or None: a path whose timed rounds
    spread beyond what an idle machine shows, by the cost curve's own criterion (the median over ``sizes`` of each
    size's interquartile range / median above ``cost.MAX_SPREAD``).  A size dearer than a larger one is not judged
    here: a kernel may be slower at a size on a machine, reproducibly, which is no load (the cost curve pads it)."""
    for name in dict.fromkeys(name for name, _ in timed.times):
        typical = statistics.median(timed.spread(name, n) for n in sizes)
        if typical > MAX_SPREAD:
            return (f"the {name} path's timed rounds spread by {100 * typical:.0f} % of their median (interquartile "
                    f"range), above the {100 * MAX_SPREAD:.0f} % an idle machine stays within")
    return None


def decide(ms: dict[str, list[float]]) -> tuple[str, str]:
    """(the path with the lowest T(1) + T(``TREE_ROWS``), the sentence that says why, against the eager path, with
    both sizes' times)."""
    best = min(ms, key=lambda name: sum(ms[name]))
    if best == BASELINE:
        return best, f"{BASELINE}: no other path verified trees faster here"
    gain = 1 - sum(ms[best]) / sum(ms[BASELINE])
    # both sizes the sum compares (T(1) alone, "9.4 vs 20.5 ms", stood beside "19%": a browser walk-through)
    return best, (f"{best}: an AR step and a {TREE_ROWS}-node tree in {gain:.0%} less time than on the {BASELINE} path "
                  f"here (T(1) {ms[best][0]:.1f} vs {ms[BASELINE][0]:.1f} ms, T({TREE_ROWS}) {ms[best][1]:.1f} vs "
                  f"{ms[BASELINE][1]:.1f} ms)")


def _key(model, gguf=None) -> str:
    files = next(s for s in SPECS.values() if s.weights == "gguf")  # a choice made without llama.cpp is made again
    ggml = "|llamacpp" if files.problem(model, gguf) is None else ""
    return f"{curve_key(model)}|{torch.get_num_threads()} threads|{os.cpu_count()} cpus{ggml}"


def _cache_file(model, cache_dir: str | Path | None, gguf=None) -> Path:
    return cache_file("forward", _key(model, gguf), cache_dir)


def _compiled(model, cache_dir: str | Path | None, spec: PathSpec) -> tuple[ForwardPath | None, str]:
    """The path ``spec``, which compiles (its artifacts in the cache root), or (None, why not)."""
    problem = compiler_problem() if "compiler" in spec.needs else None
    if problem:
        return None, problem
    use_cache_root(cache_dir)
    try:
        return spec.make(model), ""
    except Exception as exc:  # noqa: BLE001 - any refusal falls back, with its reason
        return None, first_line(exc)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else type(exc).__name__


def cold_buckets(path: ForwardPath) -> tuple[int, ...]:
    """The tree-size buckets of a compiled ``path`` not compiled yet (``warm_bucket``); () for any other path."""
    return path.cold_buckets()


@torch.no_grad()
def warm_bucket(path: ForwardPath, rows: int, past: int = 16) -> float:
    """Run one forward of ``rows`` tree rows on ``path`` over ``past`` cached tokens (a compiled path compiles that
    bucket, or loads it from inductor's cache: 60-90 s cold, 10-20 s warm on 2 cores); returns the seconds it took.
    Raises what compiling raises."""
    start = time.perf_counter()
    forward = path.open(past + rows + 1, rows)
    forward.prefill(list(range(1, past + 1)))
    forward.verify(DraftTree.chain([1] * rows, Source.ROOT)).argmax(-1).tolist()
    path.warmed(rows)
    return time.perf_counter() - start


def warm(path: ForwardPath) -> float:
    """Compile every bucket of ``path`` not compiled yet (``warm_bucket``), so no visitor's cycle waits for a
    compile; returns the seconds it took.  Raises what compiling raises."""
    return sum(warm_bucket(path, rows) for rows in cold_buckets(path))


def choose(model, want: str | None = None, compiled: bool = False,
           cache_dir: str | Path | None = None, warm_now: bool = True, gguf: Path | None = None) -> PathChoice:
    """The forward path for ``model``: ``want`` ("auto", "eager", "static", "compiled"; None reads
    ``$GOOSE_LENS_FORWARD``, default "auto").

    "auto" reads this model's and machine's cached measurement; without one it times the eager and static paths
    (a few seconds; with ``compiled`` the compiled one too, which compiles two buckets: minutes on 2 cores, the
    measurement ``scripts/forward_paths.py --choose`` makes) and caches it.  It keeps the fastest measured
    path; the compiled one is then compiled for every bucket before it is returned (``warm``: about a minute and a
    half from inductor's cache on 2 cores); without ``warm_now`` it is returned uncompiled, its buckets for the
    caller to compile (``cold_buckets``, ``warm_bucket``: the page does so between runs).  A path the model cannot
    run, or a compile that fails, leaves the eager path, with the reason in the sentence.

    Raises:
        ValueError: ``want`` is not one of ``CHOICES``.
    """
    want = want or os.environ.get(ENV) or "auto"
    if want not in CHOICES:
        raise ValueError(f"unknown forward path {want!r}: one of {', '.join(CHOICES)}")
    base = baseline().make(model)
    asked = SPECS.get(want)  # None: auto
    if asked is not None and asked.baseline:
        return PathChoice(base, f"{want}: as asked")
    if asked is None or asked.warm:  # auto may keep, and a compiled path is, the static path
        problem = static_problem(model)
        if problem:
            return PathChoice(base, f"{BASELINE}: the static path cannot serve this model: {problem}")
    if asked is not None and asked.warm:
        return _warmed(model, asked, f"{want}: as asked", {}, cache_dir, warm_now)
    if asked is not None:  # any other path, as asked, or the baseline with its sentence
        problem = asked.problem(model, gguf)
        try:
            return PathChoice(asked.make(model, gguf), f"{want}: as asked") if problem is None else \
                PathChoice(base, f"{BASELINE}: the {want} path cannot run here: {problem}")
        except ValueError as exc:
            return PathChoice(base, f"{BASELINE}: the {want} path cannot serve this model: {exc}")
    known = _read(model, cache_dir, gguf)
    if known is None or (compiled and not any(SPECS[name].warm for name in known["ms"] if name in SPECS)):
        known = _measure(model, base, compiled, cache_dir, gguf)
    chosen = SPECS[known["path"]]
    if chosen.warm:
        return _warmed(model, chosen, known["reason"], known["ms"], cache_dir, warm_now)
    path, reason = base if chosen.baseline else chosen.make(model, gguf), known["reason"]
    longer = known.get("longer") or {}
    if longer.get("from"):  # long generations on the long path (``ForwardPath.at``), the same weights
        path.longer = Longer(longer["from"], make_path(model, longer["path"], gguf), longer["reason"])
        reason += f"; {longer['reason']}"
    return PathChoice(path, reason, known["ms"])


def _read(model, cache_dir: str | Path | None, gguf=None) -> dict | None:
    """The cached measurement of ``model`` on this machine ({"path", "reason", "ms"}), or None."""
    data = read_cache(_cache_file(model, cache_dir, gguf), format=FORMAT, key=_key(model, gguf))
    return data if data is not None and data.get("path") in CHOICES[1:] else None


def _measure(model, base: ForwardPath, compiled: bool, cache_dir: str | Path | None, gguf=None) -> dict:
    """Time the paths "auto" measures (``PathSpec.auto``: the eager and static paths, the graphed one on CUDA,
    llama.cpp's for a model from a ``.gguf`` file where llama-cpp-python is installed, and, with ``compiled``, those
    measured only when asked, where they compile), decide, and cache the result unless the machine looked busy while
    the paths were timed (``busy_problem``: then the choice serves this process alone); returns it ({"path",
    "reason", "ms"})."""
    paths = {BASELINE: base}
    for spec in SPECS.values():  # llama.cpp: loads in a second; CUDA graphs: captures cost milliseconds
        if spec.auto == "measured" and not spec.baseline and spec.problem(model, gguf) is None:
            paths[spec.name] = spec.make(model, gguf)
    note = ""
    asked = [spec for spec in SPECS.values() if spec.auto == "asked"] if compiled else []
    for spec in asked:  # compiled: minutes per bucket
        if spec.warm:
            path, problem = _compiled(model, cache_dir, spec)
            if path is None:
                note = f" (the {spec.name} path cannot run here: {problem})"
            else:
                paths[spec.name] = path
        elif spec.problem(model, gguf) is None:
            paths[spec.name] = spec.make(model, gguf)
    start = time.perf_counter()
    try:
        timed = timings(model, paths)
    except Exception as exc:  # noqa: BLE001 - inductor's refusals take many forms: measured without it
        if not {spec.name for spec in asked} & set(paths):
            raise
        note = f" (compiling the forward failed: {first_line(exc)})"
        log.warning("forward path: compiling the forward failed: %s", first_line(exc))
        for spec in asked:
            paths.pop(spec.name, None)
        timed = timings(model, paths)
    ms = timed.medians((1, TREE_ROWS))
    name, reason = decide(ms)
    longer = _longer(model, name, paths[name], gguf)
    log.info("forward path: %s%s%s (measured in %.0f s; T(1), T(%d) in ms: %s)", reason, note,
             f"; {longer['reason']}" if longer and longer["from"] else "", time.perf_counter() - start, TREE_ROWS, ms)
    data = {"format": FORMAT, "key": _key(model, gguf), "path": name, "reason": reason + note, "ms": ms,
            "longer": longer}
    busy = busy_problem(timed)
    if busy is not None:  # the choice serves this process; a quieter start measures again
        log.warning("forward path: the machine looked busy while the paths were timed (%s), so this choice is not "
                    "cached and the paths will be measured again at the next start", busy)
        return data
    write_cache(_cache_file(model, cache_dir, gguf), data)  # a read-only cache only costs a re-measurement next time
    return data


def _longer(model, name: str, chosen: ForwardPath, gguf=None) -> dict | None:
    """Where the long path (``LONG_PATH``) should run long generations beside the path just chosen (``name``, one of
    llama.cpp's): an AR step of each timed over 128 and over ``LONG_CELLS`` cached tokens (``measure``), the rule
    read off them (``long_rule``); None where no long path applies (another path chosen, or llama.cpp's attention
    without flash attention unavailable)."""
    if SPECS[name].weights != LONG.weights or LONG.problem(model, gguf) is not None:
        return None
    pair = {name: chosen, LONG_PATH: LONG.make(model, gguf)}
    short, long = measure(model, pair, sizes=(1,), past=128), measure(model, pair, sizes=(1,), past=LONG_CELLS)
    return long_rule(name, {n: [short[n][0], long[n][0]] for n in pair})


def long_rule(name: str, ms: dict[str, list[float]]) -> dict:
    """The long path's rule from AR steps ``ms`` ({path: [T(1) over 128 cells, over ``LONG_CELLS``]}, ms) of the
    chosen path ``name`` and ``LONG_PATH``, each taken as linear in the cells between the two: where the long path's
    step costs ``LONG_GAIN`` less over ``LONG_CELLS``, it runs every generation from the cells where the two cross
    (rounded up to 256; at least 256), else none.  Returns {"path", "from" (cells; None: never), "reason", "ms"}."""
    (a0, a1), (b0, b1) = ms[name], ms[LONG_PATH]
    gain = 1 - b1 / a1
    if gain < LONG_GAIN:
        return {"path": LONG_PATH, "from": None, "ms": ms,
                "reason": f"{LONG_PATH} never: over {LONG_CELLS:,} cells its AR step is not cheaper ({b1:.1f} vs "
                          f"{a1:.1f} ms)"}
    slope_a, slope_b = ((y1 - y0) / (LONG_CELLS - 128) for y0, y1 in ((a0, a1), (b0, b1)))
    cross = 128.0 if b0 <= a0 else 128 + (b0 - a0) / (slope_a - slope_b)  # (a0 < b0 and a1 > b1: slope_a > slope_b)
    from_cells = max(256, -(-int(cross) // 256) * 256)
    return {"path": LONG_PATH, "from": from_cells, "ms": ms,
            "reason": f"from {from_cells:,} cells on (prompt + max new tokens) {LONG_PATH}: an AR step over "
                      f"{LONG_CELLS:,} cells {gain:.0%} cheaper ({b1:.1f} vs {a1:.1f} ms); its tree rows round unlike "
                      f"its AR step, so its divergences are attributed as ties within "
                      f"{LONG.cls.TIE_LOGITS:g} logits"}


def _warmed(model, spec: PathSpec, reason: str, ms: dict, cache_dir: str | Path | None,
            warm_now: bool = True) -> PathChoice:
    """The path ``spec`` (one that compiles) with every bucket compiled (``warm``; left to the caller without
    ``warm_now``), or the baseline path with the sentence why not."""
    path, problem = _compiled(model, cache_dir, spec)
    if path is None:
        log.warning("forward path: %s, since the %s path cannot run here: %s", BASELINE, spec.name, problem)
        return PathChoice(baseline().make(model), f"{BASELINE}: the {spec.name} path cannot run here: {problem}", ms)
    if not warm_now:
        return PathChoice(path, reason, ms)
    log.info("forward path: compiling the forward for %d tree sizes (minutes on 2 cores the first time; "
             "inductor's cache keeps them for the next start)", len(path.cold_buckets()))
    try:
        took = warm(path)
    except Exception as exc:  # noqa: BLE001 - inductor's refusals take many forms; the baseline path serves
        log.warning("forward path: %s, since compiling the forward failed: %s", BASELINE, first_line(exc))
        return PathChoice(baseline().make(model), f"{BASELINE}: compiling the forward failed ({first_line(exc)})",
                          ms)
    log.info("forward path: %s (compiled in %.0f s)", reason, took)
    return PathChoice(path, reason, ms, round(took, 1))
