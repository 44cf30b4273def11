"""The compiled planner: one object owns a generation's arrays and its one compiled entry per cycle
(``cycle_kernel.advance``, on the arrays held as one compiled object: ``cycle_state.CycleState``), and hands the loop
the same records the Python ``Planner`` does.

Source: Goose paper, Algorithm 2 (the loop), Algorithm 1 (the tree), App. B.2 / C.1 and §4.3; GT principle paper,
§3.1 (the size choice).  What each kernel mirrors is said in its module.  Issue 71: a cycle's host work in Python
touches thousands of scattered objects, and after each forward the host's caches are cold; here it runs in one
compiled call over dense arrays, and only the records the loop and the trace read are made as Python objects.

``CompiledPlanner.covers`` says which runs it serves: the default Goose configuration (sources PLD + TR, greedy, GT
"auto" on a cost curve, best-first branches, TR's estimates its scores), trees never trimmed by the model's positions,
once this process has its kernels (``KERNELS``).  Every other run plans in Python (``planner.Planner``); both give
the same trees, ghosts and tokens (tests/test_compiled_cycle.py).

The kernels compile once per machine (numba's cache, beside the sources): about 45 s on a 2-core CPU the first time,
half a second to load after.  ``KERNELS.warm()`` compiles or loads them, waiting (the command line, the tests);
``KERNELS.warm_soon()`` does it on a thread of its own (the page, which serves with the Python planner meanwhile: the
same tokens, more host time a cycle).
"""
from __future__ import annotations

import math
import threading

import numpy as np

from ..core import compat
from ..core.verify import ReadBack, warm_read_back
from ..sources import Candidates, pld_kernel
from ..sources.adjacency import ArrayTable
from ..sources.pld_kernel import PldArrays
from . import cycle_kernel as k
from . import cycle_state
from .build_kernel import MODES, built_of
from .calibration_kernel import CalibrationArrays, StatsArrays, empty_nodes
from .config import Resolved
from .cost import CostCurve
from .gt import GtChoice
from .gt_kernel import GhostArrays
from .records import Committed, Drafts, Generation, Plan, Walk
from .spine_kernel import TreeArrays


class Kernels:
    """Whether this process has the compiled cycle's kernels (compiled, or loaded from numba's cache): one warm-up,
    by a synthetic generation's first two cycles, which types every kernel as a real run does (so a real run
    never compiles), and a read-back of CPU logits (``verify.read_back``'s kernel, every planner's).  One per
    process (``KERNELS``): it holds compiled code, no user's data."""

    def __init__(self) -> None:
        self.ready = threading.Event()  # set once the kernels are compiled or loaded
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def warm(self) -> None:
        """Compile or load the kernels, waiting (about 45 s the first time on a 2-core CPU, 0.5 s after)."""
        with self._lock:
            if not self.ready.is_set():
                _warm_up()
                self.ready.set()

    def warm_soon(self) -> None:
        """``warm`` on a daemon thread, started once; returns once the read-back's kernel is loaded
        (``verify.warm_read_back``, every planner's: about a second the first time), so the generations planned in
        Python meanwhile never wait behind the cycle's compile."""
        warm_read_back()
        with self._lock:
            if self.ready.is_set() or self._thread is not None:
                return
            self._thread = threading.Thread(target=self.warm, name="compiled-cycle-warm-up", daemon=True)
            self._thread.start()


KERNELS = Kernels()

#: trees' worth of room each growth of the tables makes (``CompiledPlanner._room``).  A growth re-makes the compiled
#: state, and numba types its ~80 arrays again from Python: about 1 ms on a 2-core CPU, a third of a demo forward.
#: Room for one tree at a time grew the tables 2-3 times in a 128-token generation (docs/results.md, "Goose's cost per
#: cycle"); room for four (TR's rows and the calibration's pool, some 200 kB at the default budget of 100) covers it,
#: and longer generations grow by doubling
ROOM_TREES = 4


class CompiledPlanner:
    """Stages 1-2 and 6 of one generation's cycles, compiled: ``draft`` and ``build`` hand over what the last
    ``learn`` planned, ``learn`` learns from the cycle and plans the next in one compiled call.

    Args:
        resolved: the run's ``Resolved`` config (``covers`` it).
        cost_curve: its cost curve.
        gen: the generation, prefilled: its tokens (the prompt and the first token) and its sources (PLD and TR, whose
            settings the arrays take; their own tables stay as the prefill left them).
        prompt: the prompt's token ids; back: its rows' read-back (``verify.read_back``), TR's first rows.
        vocab: the model's vocabulary (the logits' width): TR's table has a row slot for each token.
    """

    name = "compiled"  # the trace's ``planner``

    def __init__(self, resolved: Resolved, cost_curve: CostCurve, gen: Generation, prompt: list[int],
                 back: ReadBack, vocab: int) -> None:
        cfg = resolved.config
        self.config, self.vocab = cfg, vocab
        pld, tr = gen.sources  # ``covers``: exactly these two, in registry order
        self.pld_source, self.tr_source = pld, tr
        self.width = cfg.max_budget  # the largest tree, root included
        chain_cap = cfg.variant.max_extended_chain + cfg.tree.max_spine + 1  # an extension overshoots by one lookup
        self.settings = _settings(resolved, cost_curve, pld, self.width)
        stream = np.zeros(len(prompt) + cfg.max_new_tokens + self.width + 1, np.int64)  # (cap,)
        stream[: len(gen.tokens)] = gen.tokens
        ints = np.zeros(k.N_CYCLE_INTS, np.int64)
        ints[k.C_STREAM], ints[k.C_OUTPUT] = len(gen.tokens), len(gen.output)
        floats = np.zeros(k.N_CYCLE_FLOATS, np.float64)
        w = self.width
        self.stats = StatsArrays(cfg.tree.ema_alpha, cfg.tree.ema_init, gen.stats.counterfactual)
        self.cycle = k.Cycle(
            stream=stream, ints=ints, floats=floats, ema=self.stats.ema, built=empty_nodes(w),
            ghosts=_ghosts(w), kept=empty_nodes(w), lost=_ghosts(2 * w), read=np.zeros(w, np.float64),
            kept_at=np.zeros(w, np.int64),
            trusted=(np.zeros(w, np.float64), np.zeros(w, np.float64), np.zeros(w, np.int64)),
            chain=(np.zeros(chain_cap, np.int64), np.zeros(chain_cap, np.float64)), empty=np.zeros(0, np.int64))
        self.table = ArrayTable(vocab, cfg.tree.top_k, cfg.source_config("tr").bigram_capacity,
                                renormalise=tr.renormalise)  # TR's table, as its own table holds it after the prompt
        self.table.store([None, *prompt[:-1]], prompt, back.successor_ids, back.successor_scores)
        self.index = PldArrays.like(pld)
        self.index.reserve(len(stream))
        self.calibration = CalibrationArrays()
        ints[k.C_VOCAB] = vocab
        self._state: cycle_state.CycleState | None = None  # the arrays as the compiled calls take them
        self._room()
        cycle_state.prepare(self._state)

    # -- which runs ---------------------------------------------------------------------------------------------

    @staticmethod
    def covers(resolved: Resolved, cost_curve: CostCurve | None, positions: compat.PositionLimits,
               prompt_len: int) -> bool:
        """Whether the compiled cycle serves this run: the default Goose configuration's drafting (PLD + TR, greedy,
        GT "auto" on ``cost_curve``, best-first branches, TR's scores as its estimates, no rows riding along), with
        room under the model's positions for the largest tree at the run's last cycle, and the kernels at hand
        (``KERNELS.ready``)."""
        cfg = resolved.config
        if cost_curve is None or cfg.method != "goose" or cfg.active_sources != ("pld", "tr") or cfg.sampling:
            return False
        if not cfg.gt.auto or cfg.iso_k is not None or cfg.extra_rows or cfg.variant.branch_growth != "best-first":
            return False
        if cfg.source_config("tr").calibration or not KERNELS.ready.is_set():
            return False
        room = positions.room(prompt_len + cfg.max_new_tokens)
        return room is None or room >= cfg.max_budget

    # -- the loop's stages ----------------------------------------------------------------------------------------

    def draft(self, s: Generation) -> Drafts:
        """Stage 1's record (``Planner.draft``'s): PLD's chain for the anchor, and which sources rest."""
        ci, cf = self.cycle.ints, self.cycle.floats
        resting = (self.tr_source,) if ci[k.C_RESTING] else ()
        m = int(ci[k.C_MATCH])
        tokens, p = self.cycle.chain
        chain = Candidates.chain(tokens[:m].tolist(), p[:m].tolist(), confidence=float(cf[k.D_CONFIDENCE])) if m \
            else Candidates()
        proposals = ((self.pld_source, chain),) + (() if resting else ((self.tr_source, Candidates()),))
        return Drafts(proposals, self.pld_source if m else None, chain, resting)

    def build(self, s: Generation, drafts: Drafts) -> Plan:
        """Stage 2's record (``Planner.build``'s): the tree to verify, its ghosts, GT's choice and the rows the forward
        runs, as ``learn`` (or the start) planned them."""
        c = self.cycle
        ci, cf = c.ints, c.floats
        n, g = int(ci[k.C_NODES]), int(ci[k.C_GHOSTS])
        kept, lost, built = c.kept, c.lost, c.built
        verified = built_of(TreeArrays(kept.tokens, kept.parents, kept.source, kept.scores, kept.est, kept.depth,
                                       lost.parent, lost.token, lost.source, lost.score, lost.est), n, g)
        gt = candidates = None
        if ci[k.C_HAS_GT]:
            gt = GtChoice(n, int(ci[k.C_GT_CANDIDATES]), float(cf[k.D_GT_EXPECTED]), float(cf[k.D_GT_COST]))
            as_read = TreeArrays(built.tokens, built.parents, built.source, built.scores, c.read, built.depth,
                                 *c.ghosts)  # the built tree at the estimates GT read (its ghosts not wanted)
            candidates = built_of(as_read, int(ci[k.C_BUILT]), 0).tree
        r = float(cf[k.D_SPINE_RATIO])
        budget = int(ci[k.C_BUDGET])
        tree = verified.tree
        return Plan(MODES[ci[k.C_MODE]], tree, verified.ghosts, None if math.isnan(r) else r, grafted=tree,
                    budget=None if budget < 0 else budget, chain_tokens=int(ci[k.C_CHAIN]), gt=gt,
                    left_out=drafts.resting, rows=int(ci[k.C_ROWS]), candidates=candidates)

    def learn(self, s: Generation, plan: Plan, back: ReadBack, walk: Walk, done: Committed) -> None:
        """Stage 6 of this cycle and stages 1-2 of the next, in one compiled call (``cycle_kernel.advance``); the
        generation's Python-side figures the trace reads (p_s's EMA, the AR streak, λ's curve time) follow."""
        if not self.cycle.ints[k.C_ROOM]:  # rarely: the arrays grow before the compiled call needs them
            self._room()
        verified = (np.array(walk.accepted, np.int64), np.array(done.tokens, np.int64),
                    np.ascontiguousarray(back.successor_ids, np.int64),
                    np.ascontiguousarray(back.successor_scores, np.float64))
        cycle_state.advance(self._state, verified)
        s.stats.p_s_ema = float(self.cycle.ema[1])
        s.streak, s.curve_ms = int(self.cycle.ints[k.C_STREAK]), float(self.cycle.floats[k.D_CURVE_MS])

    # -- the arrays -----------------------------------------------------------------------------------------------

    def _tables(self) -> k.Tables:
        table = self.table
        return k.Tables(pld=self.index.arrays, tr=(table.arrays, table.bigram), calib=np.zeros(0, np.float64),
                        counters=self.stats.counters, cal=self.calibration.cal, pend=self.calibration.pend)

    def _room(self) -> None:
        """Room for the next cycles, made before the compiled call (kernels never reallocate): TR's table for
        ``ROOM_TREES`` trees' rows (``ArrayTable.reserve``), the calibration's pending pool for as many nodes; then
        the compiled state over the arrays as they are now (``cycle_state.state_of``).  Called at the start and
        whenever ``cycle_kernel.has_room`` finds no room for one more tree."""
        self.table.reserve(self.vocab - 1, ROOM_TREES * self.width)
        self.calibration.reserve(ROOM_TREES * self.width)
        self._state = cycle_state.state_of(self.settings, self.cycle, self._tables())


def _ghosts(n: int) -> GhostArrays:
    """n ghosts of zeros (outputs)."""
    return GhostArrays(np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.float64),
                       np.zeros(n, np.float64))


def _settings(resolved: Resolved, curve: CostCurve, pld, width: int) -> k.Settings:
    """The resolved config as the kernels read it (``cycle_kernel.Settings``)."""
    cfg = resolved.config
    tree, variant, gt = cfg.tree, cfg.variant, cfg.gt
    tr = cfg.source_config("tr")
    ints = np.zeros(k.N_SETTINGS_INTS, np.int64)
    ints[[k.S_BUDGET, k.S_EXTENSION, k.S_MAX_EXTENDED, k.S_SCHEDULE, k.S_BYPASS, k.S_CONFIDENT_RULE,
          k.S_BYPASS_THRESHOLD, k.S_MAX_DEPTH, k.S_DEPTH_BOUNDS_SPINE, k.S_SPINE_BRANCH_MIN, k.S_CHAIN_CAP,
          k.S_DRAFT_BUDGET, k.S_REST_AFTER, k.S_RATE_TRACKED, k.S_CALIBRATE, k.S_COUNTERFACTUAL, k.S_EMA_ON_CHAINS,
          k.S_BIGRAM_CAPACITY, k.S_RENORMALISE]] = [
        tree.budget, variant.budget_extension, variant.max_extended_chain, variant.confidence_schedule, tree.bypass,
        variant.bypass_rule == "confident", tree.bypass_threshold, tree.max_depth, variant.depth_bounds_spine,
        variant.spine_branch_min, -1 if resolved.chain_cap is None else resolved.chain_cap,
        max(cfg.max_budget - 1, tree.max_spine), gt.rest_after, gt.rate == "session", resolved.path_calibration,
        gt.counterfactual_rates, variant.ema_on_chains, tr.bigram_capacity, tr.adjacency_scores == "top-k"]
    floats = np.zeros(k.N_SETTINGS_FLOATS, np.float64)
    floats[[k.F_EXTEND_ABOVE, k.F_SPINE_RATIO, k.F_PRUNE_AT, k.F_MIN_SCORE, k.F_RHO, k.F_AR_MS]] = [
        variant.extend_above, -1.0 if tree.spine_ratio is None else tree.spine_ratio, resolved.prune_at,
        tree.min_score, tree.spine_branch_ratio, curve.latency(1)]
    m = width + 1
    costs = np.array(curve.latencies(m), np.float64)  # (m,) T(1) .. T(m)
    rows = np.array([curve.verify_rows(n) for n in range(1, m + 1)], np.int64)  # (m,)
    s = pld_kernel.PldSettings(pld.chain_tokens, pld.alone, pld.long_match, pld.max_spine, pld.pooled_prior)
    return k.Settings(ints, floats, costs, rows, s)


def _warm_up() -> None:
    """A synthetic generation's first two cycles through ``CompiledPlanner`` (a 16-token vocabulary, a repeating
    prompt): every kernel typed and compiled, or loaded from the cache, with a real run's argument types."""
    from ..core.estimates import AcceptanceStats
    from ..sources import SourceMemory, make_sources
    from .config import DecodeConfig

    cfg = DecodeConfig().with_(max_new_tokens=8)
    curve = CostCurve.from_spec("past=128;1:1.0,2:1.1,4:1.2,8:1.4,16:1.8,32:2.6,64:4.2,128:7.4,256:14.6")
    stats = AcceptanceStats(counterfactual=True)
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]
    k_top, vocab = cfg.tree.top_k, 16

    def back(n: int) -> ReadBack:  # each row's successors: the next token of the repeating prompt first
        ids = np.array([[(t + j) % vocab for j in range(1, k_top + 1)] for t in range(n)], np.int64)  # (n, K)
        scores = np.tile(np.linspace(0.5, 0.01, k_top), (n, 1))  # (n, K) float64
        return ReadBack([int(i) for i in ids[:, 0]], ids, scores)

    gen = Generation(forward=None, tokens=[*prompt, 4], sources=make_sources(cfg, stats, SourceMemory()),
                     stats=stats, output=[4])
    planner = CompiledPlanner(cfg.resolved(curve), curve, gen, prompt, back(len(prompt)), vocab)
    for _ in range(2):
        plan = planner.build(gen, planner.draft(gen))
        done = Committed((5,), False)
        gen.tokens.extend(done.tokens)
        gen.output.extend(done.tokens)
        planner.learn(gen, plan, back(len(plan.tree)), Walk((), 5), done)
    warm_read_back()  # the read-back's kernel (``topk_kernel``)
