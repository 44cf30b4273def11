"""The static forward captured as CUDA graphs: one graph per tree-size bucket, captured before any run, replayed.

On a GPU a small model's forward is launch-bound: the host issues a few hundred kernels per forward, each costing
more host time than device time (docs/results.md, "On a GPU: the graphed path").  A CUDA graph records the kernels
of one forward once and replays them with one launch.  The static path (``static``) keeps every address
a forward touches fixed: the static KV cache and the per-bucket input frames (token ids, positions, the tree
attention mask).

What a cycle does here: one host-to-device copy of a small control block (the tree's tokens and parents, the
committed length, the real rows; pinned, non-blocking: ``transfer.upload_into``), then one replay.  Everything else
a cycle used to enqueue from the host is inside the graph (``GraphedForward._body``): the ancestor relation by pointer
doubling, depths and positions, the tree attention mask over the whole capacity, the ids, and each cache layer's
write slot (transformers' ``StaticLayer.cumulative_length``, copied from the committed length on the device).

When graphs are captured: only in ``GraphedPath.prepare``, which the callers run before anything is timed
(``engine.product.runs.decoder.make_decoder`` before a generation, the cost curve and the forward choice before their
timer), never inside a verification: a bucket with no graph on the buffers a run holds runs the plain static forward
(the model's own, never a compile), and the next ``prepare`` captures it.  On ZeroGPU every GPU call is a fresh fork
of the server, whose buffers hold no graphs, so each call's first ``make_decoder`` captures them, outside the run's
clock (docs/deploy.md).  A prepared set of buffers has ``capacity`` slots (at least ``GRAPH_CAPACITY``: a page run of
512 new tokens with a prompt of ``seam.PROMPT_ROOM`` tokens and the largest bucket), the capacity the cost curve
is timed at too, so the curve prices the forward runs replay.

One object owns a set's graphs: its ``GraphRunner`` (capture, the control blocks, the memory pool, replay), attached to
the set's static buffers, so the graphs go wherever the buffers go (``pool.Spares``: to the next generation).

Memory: each set of buffers (one generation's cache, frames and graphs: a "bucket set") captures into its own graph
memory pool, so a replay on one set never writes into another set's memory (two generations at once: the page's AR
beside a run).  Within a set, graphs of different buckets may share memory, so a replay may overwrite the logits of
the set's previous replay: a ``GraphedForward`` refuses a second ``verify`` before the first tree was committed (the
cycle reads its logits back, then commits), and a caller that keeps logits past that clones them.

Captures run under ``CAPTURE_LOCK`` and in ``capture_error_mode="thread_local"``: another thread's CUDA work meanwhile
(the page's model picker loading a model on its own thread) can neither break a capture nor be captured.  A capture
that fails leaves that bucket on the plain static forward, with one sentence in the log.

``GraphedCompiledPath`` ("graphed-compiled") captures ``torch.compile(model, mode="max-autotune-no-cudagraphs")``
inside each graph instead of the model's own forward: inductor fuses RMSNorm, rotary and the matmul epilogues and the
graph replays the fused kernels; it compiles in ``prepare`` (minutes per bucket), so the forward choice measures it
only where asked (``forward_choice.choose(compiled=True)``).  CUDA only, like the graphed path.

Sources: PyTorch's "CUDA Graphs" notes (``torch.cuda.graph``, warm-up on a side stream, memory pools shared only
between graphs replayed in capture order, ``capture_error_mode``); SGLang's ``cuda_graph_runner`` (capture per batch
size before serving, inputs copied into captured buffers); gpt-fast (static cache + compiled decode step); vLLM
(captures at start-up, outside any request).  Ours: capturing tree verification per bucket on this cache, with the
tree's mask built inside the graph.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

import torch

from ..transfer import upload_into
from ..tree import DraftTree, Source
from .pool import Spares
from .seam import BUCKETS, CAPACITY_STEP, bucket, round_up
from .static import StaticForward, StaticPath

log = logging.getLogger(__name__)

#: Least capacity (cache slots) of a graphed path's prepared buffers: 512 new tokens (the page's public cap), a
#: 256-token prompt (``seam.PROMPT_ROOM``) and the largest bucket fit; a longer run's first generation runs
#: uncaptured and ``prepare`` then grows the capacity to it.
GRAPH_CAPACITY = 1024
#: Held by every capture (and by whoever else must not start device work in the middle of one).
CAPTURE_LOCK = threading.RLock()


@dataclass(eq=False)
class Captured:
    """One bucket's captured forward: ``graph`` (``torch.cuda.CUDAGraph``) and ``logits``, its (rows, |V|) output
    buffer in the set's graph pool, which each ``replay`` overwrites."""

    graph: object
    logits: torch.Tensor

    def replay(self) -> torch.Tensor:
        """Enqueue the graph (no host sync); returns ``logits`` (valid once the device has run it)."""
        self.graph.replay()
        return self.logits


class GraphRunner:
    """One set of static buffers' CUDA graphs, as SGLang's graph runner owns its own: the control blocks the captured
    forwards read, the graph memory pool, each bucket's capture and its replay.  ``GraphedForward`` attaches one to
    every set it allocates (``StaticBuffers.runner``); it goes with the buffers to the next generation and is dropped
    with them when the cache regrows.

    Args:
        device: the buffers' CUDA device.
        capacity: the buffers' cache slots.

    Attributes:
        graphs: rows -> the ``Captured`` forward of that bucket on these buffers; None: its capture failed.  Only
            ``GraphedPath.prepare`` fills it.
        pool: this set's CUDA graph memory pool (``torch.cuda.graph_pool_handle``), None before its first capture.
    """

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.device, self.capacity = device, capacity
        self.graphs: dict[int, Captured | None] = {}
        self.pool = None
        self._controls: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def control(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The device inputs a captured ``rows``-row forward reads: the control block, (2 rows + 2,) int64 (tokens,
        parents, committed length, real rows), and the slot indices ``arange(capacity)``, int64."""
        if rows not in self._controls:
            self._controls[rows] = (torch.zeros(2 * rows + 2, dtype=torch.long, device=self.device),
                                    torch.arange(self.capacity, dtype=torch.long, device=self.device))
        return self._controls[rows]

    def load(self, tree: DraftTree, rows: int, length: int) -> None:
        """The cycle's one upload: ``tree`` padded to ``rows`` (padding: token 0, its own parent) at the committed
        ``length``."""
        n = len(tree)
        parents = [0, *tree.parents[1:], *range(n, rows)]  # the root and each padding row: its own parent
        upload_into(self.control(rows)[0], [*tree.tokens, *[0] * (rows - n), *parents, length, n])

    def capture(self, rows: int, body, warmups: int) -> Captured | None:
        """Capture ``body()`` (a ``rows``-row forward reading this runner's control block, loaded) into this set's
        pool, after ``warmups`` eager calls on a side stream; None (and one log line) when the capture fails.  Holds
        ``CAPTURE_LOCK``; ``capture_error_mode="thread_local"``."""
        current, stream = torch.cuda.current_stream(self.device), torch.cuda.Stream(self.device)
        with CAPTURE_LOCK:
            stream.wait_stream(current)
            try:
                with torch.cuda.stream(stream):
                    for _ in range(warmups):
                        body()
                current.wait_stream(stream)
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()  # one pool per set of buffers
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                    logits = body()  # (rows, |V|): the replay's output buffer
            except Exception as exc:  # noqa: BLE001 - any capture failure: this bucket runs without a graph
                log.warning("CUDA graph capture of %d rows failed (%s); that size runs without a graph", rows,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                current.wait_stream(stream)
                return None
            current.wait_stream(stream)
        return Captured(graph, logits)

    def replay(self, tree: DraftTree, rows: int, length: int) -> torch.Tensor | None:
        """Load ``tree`` and enqueue the ``rows``-bucket's graph (no host sync): its (rows, |V|) logits buffer; None
        (nothing loaded) when that bucket has no graph here."""
        captured = self.graphs.get(rows)
        if captured is None:
            return None
        self.load(tree, rows, length)
        return captured.replay()


class GraphedForward(StaticForward):
    """``StaticForward`` whose bucketed forwards replay the CUDA graphs its buffers' ``GraphRunner`` holds (captured
    by ``GraphedPath.prepare`` only); a bucket without one runs the model's own forward, uncaptured."""

    def __init__(self, path: GraphedPath, max_length: int, max_rows: int) -> None:
        self.path = path
        self._unread = False  # a verified tree whose logits may still be read: no replay until it is committed
        super().__init__(path, max_length, max_rows)

    def _allocate(self, want: int) -> None:
        """``StaticForward._allocate``, with a fresh ``GraphRunner`` (no graphs) on the new buffers."""
        super()._allocate(want)
        self.buffers.runner = GraphRunner(self.device, self.capacity)

    @property
    def runner(self) -> GraphRunner:
        return self.buffers.runner

    @property
    def graphs(self) -> dict[int, Captured | None]:
        """rows -> the ``Captured`` forward of that bucket on these buffers (``GraphRunner.graphs``)."""
        return self.runner.graphs

    @torch.no_grad()  # as every forward of the seam: a capture records no autograd history
    def _body(self, rows: int) -> torch.Tensor:
        """What a graph captures: the ``rows``-row frame's inputs built on the device from the control block, as
        ``StaticForward.verify`` builds them on the host (the same ids, positions, mask and write slot: padding rows
        carry token 0 at the committed length and see only the committed prefix), then the path's step.  Shapes
        depend on ``rows`` and the capacity alone.  Returns (rows, |V|) logits, the model's dtype."""
        ctl, cols = self.runner.control(rows)
        ids, pos, mask = self._frame(rows)
        tokens, parents, at, n = ctl[:rows], ctl[rows:2 * rows], ctl[2 * rows], ctl[2 * rows + 1]
        anc = torch.eye(rows, dtype=torch.bool, device=self.device)  # (rows, rows): j is i or an ancestor of i
        anc.scatter_(1, parents[:, None], True)
        up = parents[parents]
        for _ in range(max(0, math.ceil(math.log2(rows)) - 1)):  # pointer doubling, as DraftTree._doubled
            anc |= anc[up]
            up = up[up]
        anc &= (cols[:rows] < n)[:, None]  # padding rows see no row of the tree
        ids.copy_(tokens[None])
        pos.copy_(((anc.sum(dim=1) - 1).clamp(min=0) + at)[None])  # depth + committed length
        rel = cols - at  # (capacity,): slot - committed length
        seen = anc[:, rel.clamp(0, rows - 1)] & ((rel >= 0) & (rel < rows))[None]  # (rows, capacity): the tree
        seen |= (cols < at)[None]  # ... and the committed prefix, by every row
        mask.fill_(torch.finfo(self.dtype).min)
        mask[0, 0].masked_fill_(seen, 0)
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(at)  # each layer writes its rows at the committed length
        return self.step(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache,
                         use_cache=True).logits[0]

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> torch.Tensor:
        """``StaticForward.verify``: one replay where these buffers hold the bucket's graph, else the plain static
        forward.

        Raises:
            RuntimeError: the previous tree was not committed yet (its logits may still be unread; the replay would
                write over them).
        """
        if self._unread:
            raise RuntimeError("the graphed forward replays over its last logits: commit the verified tree (after "
                               "reading its logits back) before verifying the next one")
        n = len(tree)
        rows = bucket(n, self.buckets)
        replayed = self.runner.replay(tree, rows, self.length) if self.length + rows <= self.capacity else None
        if replayed is None:
            logits = super().verify(tree)
            if rows <= self.buckets[-1]:
                self.path.note_uncaptured(rows, self.capacity)
        else:
            logits = replayed[:n]  # (n, |V|): padding rows' logits are never read
            self._rows = rows
        self._unread = True
        return logits

    def _run(self, step, rows: int) -> torch.Tensor:
        return super()._run(self.model, rows)  # uncaptured: the model's own forward (never a compile in a run)

    def commit(self, keep: list[int]) -> None:
        super().commit(keep)
        self._unread = False


class GraphedPath(StaticPath):
    """The static path with each bucket's forward captured as a CUDA graph (``GraphedForward``) by ``prepare``,
    each set of buffers into its own memory pool; the graphs stay with their buffers, which a finished generation
    hands to the next (``StaticPath``).  CUDA only.

    Attributes:
        capacity: slots of the buffers ``prepare`` captures on (a multiple of ``CAPACITY_STEP``, at least
            ``GRAPH_CAPACITY``; it grows to the longest run seen).

    Raises:
        ValueError: the model is not on a CUDA device, or the static path cannot serve it.
    """

    name = "graphed"
    WARMUPS = 2  # eager forwards on a side stream before a bucket's first capture (lazy init, kernel selection)

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS) -> None:
        problem = type(self).problem(model)
        if problem:
            raise ValueError(problem)
        super().__init__(model)
        self.buckets = buckets
        self.capacity = GRAPH_CAPACITY
        # kept first: sets of the capacity runs are prepared for, then those with more graphs
        self.spares = Spares(self.SPARES, rank=lambda b: (b.capacity >= self.capacity, len(b.runner.graphs)))
        self._open = 0  # generations holding a set of buffers now
        self._wanted = 0  # the largest capacity a run needed and found no prepared buffers for
        self._warm: set[int] = set()  # buckets warmed up in this process
        self._told = False

    @classmethod
    def problem(cls, model, gguf=None) -> str | None:
        return None if torch.device(model.device).type == "cuda" else "CUDA graphs need a model on a CUDA device"

    def open(self, max_length: int, max_rows: int = 1) -> GraphedForward:
        return GraphedForward(self, max_length, max_rows)

    def take(self, want: int):
        """``StaticPath.take``, preferring the set with the most graphs; a miss is remembered for ``prepare``."""
        with self.spares.lock:
            self._open += 1
            chosen = self.spares.take(lambda b: b.capacity >= want, best=lambda b: (-len(b.runner.graphs), b.capacity))
            if chosen is None:
                self._wanted = max(self._wanted, want)
            return chosen

    def keep(self, buffers) -> None:
        """``StaticPath.keep``, dropping first the sets smaller than ``capacity``, then those with fewer graphs."""
        with self.spares.lock:
            self._open -= 1
            self.spares.keep(buffers)

    def note_uncaptured(self, rows: int, capacity: int) -> None:
        """A run verified ``rows`` rows on buffers of ``capacity`` slots without a graph: the next ``prepare``
        captures at that capacity; said once in the log."""
        with self.spares.lock:
            self._wanted = max(self._wanted, capacity)
            told, self._told = self._told, True
        if not told:
            log.info("graphed path: a %d-row tree ran uncaptured on %d slots (no graph prepared there); the next "
                     "preparation captures it", rows, capacity)

    def prepare(self, max_length: int, max_rows: int = 1) -> float:
        """Capture every bucket up to ``bucket(max_rows)`` on ``SPARES`` sets of buffers of ``capacity`` slots (grown
        to ``max_length`` + that bucket, rounded up to ``CAPACITY_STEP``, and to any run that found none), less the
        sets generations hold now; sets already captured cost nothing.  Call it outside anything timed.  Returns
        the seconds it took (about 0.1 s per capture for SmolLM2's shape on an H100)."""
        start = time.perf_counter()
        top = bucket(min(max(1, max_rows), self.buckets[-1]), self.buckets)
        with self.spares.lock:
            self.capacity = max(self.capacity, round_up(max_length + top, CAPACITY_STEP),
                                round_up(self._wanted, CAPACITY_STEP))
            self.spares.retain(lambda b: b.capacity >= self.capacity)  # smaller sets serve no run
            sets = max(1, self.SPARES - self._open)
        opened = [self.open(self.capacity - top, top) for _ in range(sets)]
        try:
            for forward in opened:
                for rows in (r for r in self.buckets if r <= top and r not in forward.graphs):
                    any_tree = DraftTree.chain([0] * rows, Source.ROOT)  # the shapes matter, not the tokens
                    forward.runner.load(any_tree, rows, forward.length)
                    forward.graphs[rows] = self._capture(forward, rows)
                    self._warm.add(rows)
        finally:
            for forward in opened:
                forward.release()
        return time.perf_counter() - start

    def _capture(self, forward: GraphedForward, rows: int) -> Captured | None:
        """Capture ``forward._body(rows)`` (its control block loaded) with its buffers' ``GraphRunner``, after warm-up
        forwards (``WARMUPS`` the first time this process captures that bucket, then one); None when it fails.
        Writes only past the committed length."""
        return forward.runner.capture(rows, lambda: forward._body(rows), 1 if rows in self._warm else self.WARMUPS)


class GraphedCompiledPath(GraphedPath):
    """The graphed path capturing ``torch.compile(model, mode=MODE)`` inside each graph (inductor's fused kernels,
    no CUDA graphs of its own: ours replay them); compiled in ``prepare``, a few minutes per bucket the first time
    (inductor's cache keeps them).  CUDA only; not for ZeroGPU, which does not support ``torch.compile``
    (Hugging Face, "Spaces ZeroGPU").

    Raises:
        ValueError: as ``GraphedPath``.
    """

    name = "graphed-compiled"
    MODE = "max-autotune-no-cudagraphs"
    compiles = True

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS) -> None:
        super().__init__(model, buckets)
        self.step = torch.compile(model, mode=self.MODE, dynamic=False)
