"""The cost curve on this machine: measured once per model and device, cached on disk.

Source: GT principle paper, §3.1 (Eq. 6): T(n), the time of one verification forward of n tree nodes plus the
logit harvest (``engine.decoding.cost.CostCurve`` holds it and says how the loop reads it).

Storage: one JSON file per (model, device, dtype, attention kernel, packed linears, torch version) under
``$GOOSE_LENS_CACHE/cost`` (default ~/.cache/goose-lens/cost), format ``FORMAT``, written atomically
(temporary file, then ``os.replace``).  ``measure_cost_curve`` returns a fresh curve and writes nothing: the page's
"re-measure" uses it for one user's session.  A curve that fails its check (``CostCurve.problem``: medians
non-decreasing within noise, rounds' spread bounded; a machine busy while it was measured) is never written, and a
cached one that fails it is measured again: a curve taken on a busy machine would size every later run's trees.

State: the process's shared curves are one object's (``CurveStore``, ``CURVES``); ``CurveOwner`` answers for one
loaded model on one forward path, and chooses a run's curve once (``CurveOwner.for_run``: a ``RunCurve``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from engine.core.forward import EagerPath, ForwardPath, baseline
from engine.core.tree import DraftTree
from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CONTEXT_TOLERANCE, NOISE_MS, CostCurve, CurveRefiner
from engine.product.models.timing import Timings, cache_file, read_cache, time_forwards, write_cache
from engine.sources.tr import TrSource

log = logging.getLogger(__name__)  # start-up steps, for the console (app.py shows INFO)

SIZES = (*range(1, 17), 20, 24, 32, 48, 64, 128)  # every size to 16: a kernel may price rows in blocks (torch's
# 4-bit CPU kernel tiles rows four at a time), and the size choice interpolates between measured sizes
MEASUREMENT = 6  # how a cached curve was measured (sizes shuffled each round, the loop's own read-back timed, raw
# medians kept, never a fitted curve; 5: the llamacpp path's values moved to f16; 6: each size between one-row steps,
# charged the step after it: ``timing.time_forwards``); an older one is measured again
REFINE_ENV = "GOOSE_LENS_REFINE_CURVE"  # "0": the shared curve is never corrected from runs (tests' fixed curves)
RETRY_PAUSE_S = 2.0  # the pause before measuring again a curve that failed its check (a burst of load may pass)
REPEATS = 7  # timed rounds of a shared curve (after a warm-up round)
RETRY_ROUNDS = 4  # rounds added to a curve that failed its check, pooled with its first ones: a noisy first try costs
# about half again its time, not twice it (issue 70: 61 s where 30 were promised)


def curve_key(model, path: ForwardPath | None = None) -> str:
    """What a curve depends on: the model (its folder's or file's name and a hash of where it came from, never
    a path), device, dtype, attention kernel, the layers' own kernels (a module's ``kernel``: packed bf16
    linears, 4-bit ones), torch version and the forward path that runs the trees (``engine.core.forward``; None:
    the eager one, whose key is as before; the static and compiled paths add their name).  A path whose forwards
    the torch model does not run (``ForwardPath.speed_identity``: the llamacpp path) gives its own identity in
    place of the dtype, kernels and torch version."""
    where = str(model.name_or_path)
    name = f"{Path(where).name or where}#{hashlib.sha1(where.encode()).hexdigest()[:8]}"
    own = path.speed_identity() if path is not None else None
    if own is not None:
        return f"{name}|{model.device}|{own}|{path.name}"
    attn = getattr(model.config, "_attn_implementation", None) or "default"
    kernels = "".join(f"|{k}" for k in sorted({getattr(m, "kernel", "") for m in model.modules()} - {""}))
    forward = "" if path is None or path.name == baseline().name else f"|{path.name}"  # the baseline: no mark
    return f"{name}|{model.device}|{model.dtype}|{attn}{kernels}|torch {torch.__version__}{forward}"


def measure_cost_curve(model, sizes: tuple[int, ...] = SIZES, past: int = 128, repeats: int = 7,
                       path: ForwardPath | None = None) -> CostCurve:
    """Measure a fresh curve; writes nothing (so a page's re-measure stays in that user's session).

    Per size n: one verification forward of an n-node chain over ``past`` cached tokens, the cycle's read-back and
    the adjacency store, timed by the project's one timer (``timing.time_forwards``: sizes in a new order each round,
    the warm-up round dropped); ``ms`` is the median of ``repeats`` rounds, ``spread`` their interquartile range /
    median, for the check ``CostCurve.problem``.  ``path``: the forward path the curve is of
    (``engine.core.forward``; default the eager path), so the curve prices the forward that runs (a compiled path's
    padded buckets included).
    """
    return CurveTiming(model, path, sizes, past).curve(repeats)


class CurveTiming:
    """One cost-curve measurement on one prefilled forward: rounds timed, then more rounds pooled with them where the
    first ones looked noisy (``CurveStore.cached``), and an estimate of how long the rounds take, for the console.

    Args:
        model: the transformers causal LM; path: its forward path (None: the eager one).
        sizes: tree sizes (rows); past: cached tokens before each tree.
    """

    def __init__(self, model, path: ForwardPath | None, sizes: tuple[int, ...] = SIZES, past: int = 128) -> None:
        self.model, self.sizes, self.past = model, tuple(sizes), past
        self.path = path if path is not None else EagerPath(model)
        self.vocab = model.config.get_text_config().vocab_size
        self.path.prepare(past + max(sizes) + 1, max(sizes))  # captures (graphed) before the timer, at a run's size
        self.forward = self.path.open(past + max(sizes) + 1, max(sizes))
        gen = torch.Generator().manual_seed(0)
        self.forward.prefill(torch.randint(0, self.vocab, (past,), generator=gen).tolist())
        self.times: dict = {}  # (path name, rows) -> every timed round's ms so far
        self.latest: CostCurve | None = None  # the curve of the last call's rounds alone
        self.seed = 0

    def curve(self, repeats: int) -> CostCurve:
        """Time ``repeats`` more rounds (after one warm-up round), pool them with the rounds before, and return the
        curve of every round so far."""
        timed = time_forwards({self.path.name: self.forward}, self.sizes, self.vocab, self.model.device, repeats,
                              seed=self.seed)
        self.seed += 1  # another round order and other chains next time
        for pair, ms in timed.times.items():
            self.times.setdefault(pair, []).extend(ms)
        self.latest = self._curve(timed)  # these rounds alone: whether a flagged size reproduces (``_agree``)
        return self._curve(Timings(self.times, timed.first))

    def _curve(self, timed: Timings) -> CostCurve:
        """The curve of ``timed``'s rounds: each size's median and spread."""
        name = self.path.name
        return CostCurve(self.sizes, tuple(timed.median(name, n) for n in self.sizes), self.past,
                         curve_key(self.model, self.path), tuple(timed.spread(name, n) for n in self.sizes))

    def estimate_s(self, repeats: int) -> float:
        """Seconds ``repeats`` rounds and the warm-up take here, from probe forwards of 1 and 16 rows (each twice, the
        faster kept; T(n) taken as linear between them), each size timed between one-row steps as ``time_forwards``
        does.  On SmolLM2's llamacpp path it said 28 s for a measurement of 20 before the probes were doubled."""
        ms = {1: float("inf"), 16: float("inf")}
        for n in (1, 16, 1, 16):  # each twice, the faster kept: a first forward of a shape builds its graph
            tree = DraftTree.chain([1] * n, TrSource.info.source)  # as the timer's chains
            start = time.perf_counter()
            self.forward.verify(tree).argmax(-1).tolist()  # the read-back syncs, as the timer's does
            ms[n] = min(ms[n], 1000 * (time.perf_counter() - start))
            self.forward.commit([])
        slope = max(0.0, (ms[16] - ms[1]) / 15)
        per_round = sum(ms[1] + slope * (n - 1) + 2 * ms[1] for n in self.sizes)
        return (repeats + 1) * per_round / 1000


def _cache_path(model, cache_dir: str | Path | None, path: ForwardPath | None = None) -> Path:
    return cache_file("cost", curve_key(model, path), cache_dir)


class CurveStore:
    """This process's shared cost curves: each one read from the disk cache or measured (``curves``) and the forwards
    runs made on it (``refiners``), both by cache file; a measurement of the machine, no user data, so one store
    serves every visitor of a shared server (``CURVES``; a visitor's own re-measured curve lives in their
    ``gr.State``, never here).  ``CurveOwner`` asks it for one model on one forward path.

    Args:
        cache_dir: the cache root (None: ``$GOOSE_LENS_CACHE``, read at each use; ``timing.cache_file``).
    """

    def __init__(self, cache_dir: str | Path | None = None) -> None:
        self.cache_dir = cache_dir
        self.curves: dict[Path, CostCurve] = {}  # curves already read or measured in this process
        self.refiners: dict[Path, CurveRefiner] = {}  # per shared curve: the forwards runs made on it (times)

    def file(self, model, path: ForwardPath | None = None) -> Path:
        """The cache file of ``model``'s curve on forward ``path`` (default eager) under this store's root."""
        return _cache_path(model, self.cache_dir, path)

    def cached(self, model, refresh: bool = False, path: ForwardPath | None = None,
               say: Callable[[str], None] | None = None) -> CostCurve:
        """The model's shared cost curve: read from the disk cache, or measured and stored when absent,
        unreadable, of another format or ``refresh`` (an operator's re-measure: every user of the cache
        sees the new curve; a page visitor's re-measure must use ``measure_cost_curve`` instead), or measured at
        sizes other than ``SIZES`` or by an older ``MEASUREMENT``, or when the cached curve fails its check.
        ``path``: the forward path whose curve it is (default: the eager one); ``say``: told each step of a
        measurement in words with its estimated seconds, as the console is (e.g. the page's status line, while a
        visitor waits for it).

        A fresh curve that fails its check (``CostCurve.problem``) is not written: it is measured once more after
        ``RETRY_PAUSE_S`` s; a second failure keeps the quieter of the two (``_quieter``) for this process only (in
        this store, never on disk) with one warning, so the next start measures again."""
        file = self.file(model, path)
        known = None if refresh else self.known(model, path)
        if known is not None:
            return known
        timing = CurveTiming(model, path)
        _said(say, "timing verification forwards of 1-128 rows (once per machine and model, about %.0f s here)",
              timing.estimate_s(REPEATS))
        start = time.perf_counter()
        curve = timing.curve(REPEATS)
        problem = curve.problem()
        if problem is not None:
            _said(say, "%s; timing %d more rounds (about %.0f s) and pooling them with the first %d", problem,
                  RETRY_ROUNDS, timing.estimate_s(RETRY_ROUNDS), REPEATS)
            time.sleep(RETRY_PAUSE_S)
            again = timing.curve(RETRY_ROUNDS)  # every round so far: a burst of load outvoted, not the whole redone
            problem = again.problem()
            # reproduced: the added rounds alone agree with the first ones, so this machine's own curve, not its load
            if problem is not None and _agree(curve, timing.latest):
                curve = self.curves[file] = _quieter(curve, again)
                log.info("cost curve: %s, and a second measurement agrees with the first within %.0f %% at every "
                         "size: a kernel slower at that size on this machine, not load; cached", problem,
                         100 * AGREE_REL)
                write_cost_curve(curve, file, reproduced=True)
                return curve
            if problem is not None:
                curve = self.curves[file] = _quieter(curve, again)
                log.warning("cost curve: the machine looked busy while it was measured (%s), so this process uses "
                            "the better of two measurements (T(1) = %.1f ms) without caching it, and the curve will "
                            "be measured again at the next start", problem, curve.ms[0])
                return curve
            curve = again
        self.curves[file] = curve
        log.info("cost curve: T(1) = %.1f ms, T(16) = %.1f ms (measured in %.0f s)", curve.ms[0],
                 curve.ms[curve.nodes.index(16)] if 16 in curve.nodes else curve.ms[-1], time.perf_counter() - start)
        write_cost_curve(curve, file)
        return curve

    def known(self, model, path: ForwardPath | None = None) -> CostCurve | None:
        """The model's shared cost curve (of forward ``path``, default eager) when it is measured already (in this
        store or the disk cache, as ``cached`` reads it: of this key, ``SIZES`` and ``MEASUREMENT``, passing its
        check), else None: never measures (for a thread that must not time forwards)."""
        file = self.file(model, path)
        if file in self.curves:
            return self.curves[file]
        data = read_cache(file, measurement=MEASUREMENT, key=curve_key(model, path))
        try:
            curve = CostCurve.from_dict(data) if data is not None else None
        except ValueError:
            curve = None  # another format or bad values
        if curve is None:
            return None  # absent, unreadable, of another key or measurement: measured when first needed
        if curve.nodes == SIZES and (curve.problem() is None or data.get("reproduced")):
            # a busy curve cached before the check existed (no spread: only its medians are checked) is measured
            # again; one flagged twice alike was this machine's own (``_agree``)
            self.curves[file] = curve
            return curve
        return None

    def refine(self, model, traces, prompt_tokens: int, path: ForwardPath | None = None) -> CostCurve | None:
        """Correct the model's shared curve from a finished run's own forwards (``CurveRefiner``: ours; T(n) is the
        GT principle's, §3.1 Eq. 6): each decoding cycle's forward time (its "forward" lap: the forward and its
        read-back) at its rows (the tree and the rows riding along), where its context is within
        ``CONTEXT_TOLERANCE`` of the curve's ``past`` (a forward over fewer cached tokens is faster).  Where at least
        5 recent forwards of a size disagree with the curve beyond the noise band, the corrected raw medians at
        ``SIZES`` (never the fit: ``refine_curve``), passing its check, replace the shared one for later runs, in
        this store and on disk; a run keeps the curve it started with, so its trees replay from the curve it
        recorded.  Only a curve this store holds is refined (a visitor's own re-measured curve never is);
        ``$GOOSE_LENS_REFINE_CURVE`` = "0" turns it off.

        Args:
            model: the model the run ran on; traces: its ``CycleTrace``s (prefill included, skipped); prompt_tokens:
                its prompt's length in tokens (a cycle's context: the prompt and the output before its anchor);
                path: its forward path (default eager).

        Returns:
            the new shared curve, or None when nothing changed.
        """
        file = self.file(model, path)
        prior = self.curves.get(file)
        if prior is None or prior.nodes != SIZES or os.environ.get(REFINE_ENV) == "0":
            return None
        refiner = self.refiners.get(file)
        if refiner is None or refiner.prior is not prior:
            refiner = self.refiners[file] = CurveRefiner(prior)
        before = 0  # output tokens before the cycle
        for trace in traces:
            past = prompt_tokens + before - 1  # the cached tokens its forward read: the anchor is its first row
            if trace.mode != "prefill" and "forward" in trace.timings_ms \
                    and abs(past - prior.past) <= CONTEXT_TOLERANCE * prior.past:
                refiner.observe(trace.forward_rows, trace.timings_ms["forward"])
            before = trace.total_tokens
        refined = refiner.curve()
        if refined is prior:
            return None
        spread = None if refined.spread is None else tuple(refined.spread[refined.nodes.index(n)] for n in SIZES)
        fixed = CostCurve(SIZES, tuple(round(refined.raw(n), 3) for n in SIZES), prior.past, prior.key, spread)
        reproduced = prior.problem() is not None  # a curve cached as this machine's own (a slow size) stays so
        if fixed.problem() is not None and not reproduced:
            return None
        self.curves[file] = fixed
        self.refiners[file] = CurveRefiner(fixed)
        write_cost_curve(fixed, file, reproduced=reproduced)
        log.info("cost curve: corrected from the runs' own forwards: T(1) %.1f -> %.1f ms, T(16) %.1f -> %.1f ms",
                 prior.latency(1), fixed.latency(1), prior.latency(16), fixed.latency(16))
        return fixed


CURVES = CurveStore()  # this process's shared curves (the page's, the CLI's and the bench's)


def _said(say: Callable[[str], None] | None, words: str, *args) -> None:
    """A measurement's step (``words % args``) on the console, and to ``say`` when given."""
    log.info("cost curve: " + words, *args)
    if say is not None:
        say(words % args)


AGREE_REL = 0.10  # two flagged measurements whose medians agree this closely at every size show the machine's own
# curve, not its load (docs/results.md, "The cost curve": a curve flagged twice alike)


def _agree(a: CostCurve, b: CostCurve) -> bool:
    """Whether two measurements of one curve agree within ``AGREE_REL`` (+ the noise band's ms) at every size."""
    return all(abs(x - y) <= AGREE_REL * max(x, y) + NOISE_MS for x, y in zip(a.ms, b.ms))


def _quieter(a: CostCurve, b: CostCurve) -> CostCurve:
    """Of two curves that both failed their check, the one measured on the quieter machine: the lower sum of medians
    (another process's load only ever adds time to a forward, never takes it away); ``a`` on a tie."""
    return b if sum(b.ms) < sum(a.ms) else a


def write_cost_curve(curve: CostCurve, path: str | Path, reproduced: bool = False) -> bool:
    """Write ``curve`` to ``path`` atomically (``timing.write_cache``), so a reader never sees a half-written file;
    the file is stamped with this ``MEASUREMENT`` (and ``reproduced``: a curve that fails its check the same way
    twice, read back as this machine's own).  Returns False when the folder is not writable."""
    mark = {"reproduced": True} if reproduced else {}
    return write_cache(Path(path), {**curve.to_dict(), "measurement": MEASUREMENT, **mark})


class RunCurve(NamedTuple):
    """One run's cost curve, chosen once (``CurveOwner.for_run``) and read by everything of that run: a pair
    (``shown``, ``read``), so a handler unpacks it where it asks.

    Attributes:
        shown: what the page shows and prices the run on (the cost sentence, the lesson, the prefill estimate, the
            race's prediction, AR's decoders): the visitor's own curve, else the shared one; None where the run
            needs none (a sweep whose every value gives GT's c as a number).
        read: what the run's GT rule reads and its record keeps (``Run.cost_curve``): the visitor's own curve, else
            ``shown`` where the config's GT rule reads a curve ("auto", "chord"), else None.
    """

    shown: CostCurve | None
    read: CostCurve | None


class CurveOwner:
    """The one owner of a loaded model's cost curve on its forward path: the page, the CLI, the bench and
    ``make_decoder`` ask it; its shared curve is ``store``'s (in memory and on disk), whether a visitor's own curve
    belongs to it is its call (``own``), and a run's curve is chosen once, by ``for_run``.

    Args:
        model: the transformers model; path: its ``ForwardPath`` (the curve is of the forward that runs);
        store: the process's shared curves (None: ``CURVES``).
    """

    def __init__(self, model, path: ForwardPath | None = None, store: CurveStore | None = None) -> None:
        self.model, self.path = model, path
        self.store = store if store is not None else CURVES

    def known(self) -> CostCurve | None:
        """The shared curve when measured already, else None: never measures (``CurveStore.known``)."""
        return self.store.known(self.model, self.path)

    def shared(self, say: Callable[[str], None] | None = None) -> CostCurve:
        """The shared curve, measured and cached the first time (``CurveStore.cached``; ``say``: told the
        measurement's steps in words)."""
        return self.store.cached(self.model, path=self.path, say=say)

    def fresh(self) -> CostCurve:
        """A new measurement that writes nothing: one visitor's own curve (``measure_cost_curve``)."""
        return measure_cost_curve(self.model, path=self.path)

    def refine(self, traces, prompt_tokens: int) -> CostCurve | None:
        """The shared curve corrected from a finished run's forwards (``CurveStore.refine``; ``prompt_tokens``: its
        prompt's length); None: unchanged."""
        return self.store.refine(self.model, traces, prompt_tokens, path=self.path)

    def own(self, curve: CostCurve | None) -> CostCurve | None:
        """``curve`` (a visitor's re-measured one) when it is of this model on this path (its key is this owner's:
        ``curve_key``), else None: the visitor's runs on this model then read the shared curve."""
        return curve if curve is not None and curve.key == curve_key(self.model, self.path) else None

    def for_run(self, own: CostCurve | None, config: DecodeConfig, needed: bool = True) -> RunCurve:
        """The curve one run reads, chosen once (``RunCurve``): ``own`` (a visitor's re-measured curve, or one the
        caller loaded), else the shared one (measured here the first time), or none when ``needed`` is False and no
        ``own`` is given; GT reads it where ``config``'s rule reads a curve, or where it is ``own``."""
        shown = own if own is not None or not needed else self.shared()
        return RunCurve(shown, shown if own is not None or config.needs_cost_curve else None)
