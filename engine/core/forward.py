"""The one seam that runs the model on a draft tree: a ``TreeForward`` owns one generation's KV cache.

Every forward loop of the project goes through it (the decoding loop, the cost curve's measurement, the replay of
AR's logits for attributing a divergence, the precision's and the thread's timings), so what is timed is what runs.
A ``ForwardPath`` is a model's way of running it, shared by every generation of that model; ``open`` gives one
generation its own ``TreeForward`` (its own cache: nothing is shared between generations running at
once; the static paths hand a finished generation's buffers to the next, ``StaticPath``).

Three paths, one interface (``prefill`` → ``verify`` → ``commit``, the committed ``length``):

* ``"eager"``: transformers' ``DynamicCache`` (``kv_cache``), each tree forwarded at its own size; the reference
  and the fallback.
* ``"static"``: transformers' ``StaticCache``, allocated once for the run (the prompt, the new tokens and the
  largest tree) and initialised before any forward; each tree's rows are written at the committed length and the
  4D tree attention mask ``(1, 1, n, capacity)`` lets every row see the committed prefix and its own ancestors, so
  the slots past them (rows of earlier trees) are never read.  The shapes of a forward depend on the tree size
  alone.
* ``"compiled"``: the static path with each tree padded to a bucket size (``BUCKETS``) and the model's forward
  compiled by ``torch.compile`` (inductor), one graph per bucket: the shapes a compiled graph needs stay fixed.
  Padding rows carry token 0 at the committed length's position and see only the committed prefix, so no real row
  sees them and their logits are never read (tests/test_forward.py checks both).

Sources: gpt-fast's static KV cache and compiled decode step (the model of a forward that costs its arithmetic);
SGLang's graph runner (trees padded to a captured batch size, inputs copied into fixed buffers); transformers'
``StaticCache`` (``early_initialization``: the cache exists before any compiled call).  Tree attention as in
SpecInfer / Medusa.  Ours: the bucket set and the commit of a tree path into a static cache.
"""
from __future__ import annotations

import bisect
import logging
import threading
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from . import kv_cache
from .transfer import upload
from .tree import DraftTree
from .verify import forward_tree

log = logging.getLogger(__name__)

#: Tree sizes a compiled graph is built for (a tree is padded to the next one; a larger tree runs the model's own
#: forward at its size, on the same static cache).  Powers of two: the padding is at most as many rows as the
#: tree's own, and the trees GT sizes on a CPU (1-32 rows) need 6 graphs.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
#: Capacity of a static cache is rounded up to a multiple of this (tokens); the attention reads the whole capacity,
#: so the step stays small.  A compiled graph takes the capacity as a dynamic size: runs of any length share it.
CAPACITY_STEP = 256
#: Prompt tokens a run is expected to stay within when a path is prepared before its prompt is known
#: (``ForwardPath.prepare`` from ``engine.product.runs.decoder.make_decoder``: max new tokens + this); a longer
#: prompt only runs on buffers prepared for it later (the graphed path: uncaptured, at the static path's speed).
PROMPT_ROOM = 256
class TreeForward(ABC):
    """One generation's KV cache and the forwards that fill it.

    ``length`` is the number of committed positions.  ``prefill`` fills it with the prompt; ``verify`` runs one
    tree over it (the cache then also holds the tree's rows, uncommitted); ``commit`` keeps the rows of a path
    and drops the rest.
    """

    length: int = 0

    @abstractmethod
    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Forward the prompt (no positions committed before); commits it.

        Args:
            ids: L >= 1 prompt token ids.

        Returns:
            (L, |V|) logits, the model's dtype, on the model's device (valid as ``verify``'s).
        """

    @abstractmethod
    def verify(self, tree: DraftTree) -> torch.Tensor:
        """Score every node of ``tree`` (node 0, the anchor, not yet in the cache) in one forward over the
        committed prefix: the tree attention mask lets each node see the prefix, its ancestors and itself;
        position of node i = ``length`` + depth(i).  No host sync: on an accelerator the forward is only enqueued.

        Returns:
            (n, |V|) logits, the model's dtype, on the model's (first) device; row i predicts the token after node i.
            They may live in the path's own buffer (llamacpp's), valid until this forward's next ``prefill`` or
            ``verify``: a caller keeping rows longer copies them.
        """

    @abstractmethod
    def commit(self, keep: list[int]) -> None:
        """Keep the rows ``keep`` (indices into the last verified tree, in path order, usually ``[0, *accepted]``)
        as the next ``len(keep)`` committed positions; drop every other row of that tree."""


class Longer(NamedTuple):
    """A forward path's rule for long generations (``ForwardPath.at``): from ``from_cells`` cells on (prompt + max
    new tokens), ``path`` runs them, ``reason`` saying why in one sentence (measured by the forward choice)."""

    from_cells: int
    path: ForwardPath
    reason: str


class ForwardPath(ABC):
    """A model's way of running trees, shared by all its generations; ``open`` gives one generation its cache.

    Attributes:
        model: the transformers causal LM.
        name: the path's name (``engine.core.paths.SPECS`` holds every path, with its facts).
    """

    name: str
    #: Whether a row's logits are bit-identical whatever batch verifies it (a tree row equals its AR step on this
    #: path): then no divergence from AR on this path is a precision tie (``engine.product.runs.lossless``).
    #: False on torch's paths: a batched forward rounds unlike a one-row step.
    ROWS_EXACT = False
    #: Where rows are not exact and the logits are not the model dtype's rounding alone (llama.cpp's 8-bit
    #: activations after a kernel that differs by batch): how far apart, in logits, the two tokens of a divergence
    #: may read in AR's step and still be a precision tie.  None: ties are judged in ulps of the dtype
    #: (``engine.product.runs.lossless.TIE_ULPS``).
    TIE_LOGITS: float | None = None

    def __init__(self, model) -> None:
        self.model = model
        self.longer: Longer | None = None  # another path for long generations (``at``), set by the forward choice

    def at(self, cells: int) -> ForwardPath:
        """The path a generation of ``cells`` cells (prompt + max new tokens) runs on: ``longer``'s path from its
        threshold on (e.g. llama.cpp's attention without flash attention over a long context), else this one.  A run,
        its AR reference and the attribution of a divergence all take the path this returns, so each is held to AR on
        the same kernels."""
        return self.longer.path if self.longer is not None and cells >= self.longer.from_cells else self

    @classmethod
    def for_model(cls, model, gguf=None) -> ForwardPath:
        """This path for ``model``; ``gguf``: the ``.gguf`` file the model was converted from, for a path that runs
        the file itself (None: not from a GGUF file).  Raises ValueError when this path cannot serve the model."""
        return cls(model)

    @classmethod
    def problem(cls, model, gguf=None) -> str | None:
        """Why this path cannot run ``model`` here (one sentence), or None; checked before any forward."""
        return None

    def describe(self) -> str | None:
        """What runs, for a model line, when it is not the transformers model in its own dtype; None otherwise."""
        return None

    def weights(self) -> str | None:
        """The weight type every forward of this path runs when it is not the transformers model's own, e.g. "Q4_1"
        (a GGUF file's 4-bit blocks on llama.cpp's kernels); None: the model's own weights in its own dtype run.
        A run on such a path is held to AR on the same path, never to ``generate`` on the torch model."""
        return None

    def speed_identity(self) -> str | None:
        """What this path's speed depends on when the transformers model's own dtype and kernels do not run its
        forwards (the cost curve's key reads it instead of theirs); None: they run them."""
        return None

    def cold_buckets(self) -> tuple[int, ...]:
        """Tree-size buckets this path compiles on first use and has not yet (``warmed``); () on a path that compiles
        nothing (every path but the compiled one)."""
        return ()

    def warmed(self, rows: int) -> None:  # noqa: B027 - a hook only a path that compiles overrides
        """Note that bucket ``rows`` was compiled ahead of any run (``engine.product.models.forward_choice.warm``);
        nothing to note on a path that compiles nothing."""

    def prepare(self, max_length: int, max_rows: int = 1) -> float:
        """Make ready, before anything is timed, what a generation of at most ``max_length`` committed positions
        whose trees have at most ``max_rows`` rows will run (the graphed path captures its CUDA graphs here:
        ``engine.core.graphs``); never called inside a timed run.  Returns the seconds it took (0.0: nothing to do,
        as on every path but the graphed ones).  Raises nothing a forward would not raise."""
        return 0.0

    @abstractmethod
    def open(self, max_length: int, max_rows: int = 1) -> TreeForward:
        """A fresh ``TreeForward`` for a run of at most ``max_length`` committed positions (prompt + new tokens)
        whose trees have at most ``max_rows`` nodes (larger ones still run, the static cache is then regrown)."""


class EagerForward(TreeForward):
    """``TreeForward`` over transformers' ``DynamicCache``: each tree forwarded at its size (``kv_cache``)."""

    def __init__(self, model, max_length: int) -> None:
        self.model = model
        self.cache = kv_cache.new_cache(model, max_length)
        self.length = 0
        self._rows = 0  # rows of the last verified tree, still in the cache

    @torch.no_grad()
    def prefill(self, ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long, device=self.model.device)  # (1, L)
        logits = self.model(input_ids=x, cache=self.cache, use_cache=True).logits[0]  # (L, |V|)
        self.length = len(ids)
        return logits

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> torch.Tensor:
        if self._rows:
            self.commit([])  # an uncommitted tree: dropped
        logits = forward_tree(self.model, self.cache, tree, self.length)  # (n, |V|)
        self._rows = len(tree)
        return logits

    def commit(self, keep: list[int]) -> None:
        kv_cache.keep_path(self.cache, self.length, keep)
        self.length += len(keep)
        self._rows = 0


class EagerPath(ForwardPath):
    """The reference path: ``EagerForward`` for every generation."""

    name = "eager"

    def open(self, max_length: int, max_rows: int = 1) -> TreeForward:
        return EagerForward(self.model, max_length)


def bucket(n: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket >= ``n`` rows; ``n`` itself beyond the largest."""
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else n


def static_problem(model) -> str | None:
    """Why ``model`` cannot run the static path (a sentence), or None: every cache layer transformers' ``StaticCache``
    builds for it must be a plain full-attention ``StaticLayer`` on one device (no sliding window, no recurrent or
    shared layers, no model spread over several GPUs)."""
    try:
        layers = StaticCache(config=model.config, max_cache_len=1).layers
    except Exception as exc:  # noqa: BLE001 - any refusal of transformers' own is a reason
        return f"transformers builds no static cache for it ({exc})"
    kinds = sorted({type(layer).__name__ for layer in layers if type(layer) is not StaticLayer})
    if kinds:
        return f"its cache has {kinds} layers (a static cache of full-attention layers only)"
    if getattr(model, "hf_device_map", None) and len(set(model.hf_device_map.values())) > 1:
        return "it is spread over several devices"
    return None


@dataclass(eq=False)  # one set of device buffers is itself, never equal to another
class StaticBuffers:
    """A static forward's device state, kept past its generation for the next one (``StaticPath.open``).

    Attributes:
        cache: transformers' ``StaticCache``, ``capacity`` slots per layer, initialised.
        capacity: slots (tokens), a multiple of ``CAPACITY_STEP``.
        frames: rows -> the persistent inputs of a forward of that many rows (``StaticForward._frame``).
        graphs: rows -> the CUDA graph captured on this cache and frame, and its logits buffer (None: the capture
            failed); only the graphed path (``engine.core.graphs``) fills it.
        controls: rows -> the device inputs a captured forward reads (``engine.core.graphs``).
        pool: the CUDA graph memory pool of this set's graphs (``torch.cuda.graph_pool_handle``), None before any.
    """

    cache: StaticCache
    capacity: int
    frames: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    graphs: dict = field(default_factory=dict)
    controls: dict = field(default_factory=dict)
    pool: object = None


class StaticForward(TreeForward):
    """``TreeForward`` over transformers' ``StaticCache``: fixed buffers sized to the run, trees padded to a bucket
    when the path has ``buckets`` (the compiled and graphed paths), the forward run by the path's ``step`` (the
    model, or its compiled form).

    The cache's slots: 0 .. length - 1 committed; a verified tree's rows (padding included) at length ..
    length + rows - 1; beyond that, rows of earlier trees (or of an earlier generation, when the buffers were
    kept: ``StaticPath.open``), never attended (the mask).  transformers' ``StaticLayer`` writes each forward's rows
    at its ``cumulative_length``, set to ``length`` before each forward.
    """

    def __init__(self, path: StaticPath, max_length: int, max_rows: int) -> None:
        self.model, self.step, self.buckets = path.model, path.step, path.buckets
        self.compiled = self.step is not self.model  # a compiled step: every size that may vary is marked dynamic
        self.device, self.dtype = torch.device(self.model.device), self.model.dtype
        self.length = 0
        self._rows = 0  # rows (padding included) of the last verified tree
        want = max_length + (bucket(max_rows, self.buckets) if self.buckets else max_rows)
        self._held = [path.take(want)]  # a finished generation's buffers when large enough, else new ones
        if self._held[0] is None:
            self._allocate(want)
        self._release = weakref.finalize(self, path.keep, self._held)  # its buffers serve the next when it is done

    def release(self) -> None:
        """Hand this forward's buffers to the path now (``StaticPath.keep``), as its end would; use it no more."""
        self._release()

    @property
    def buffers(self) -> StaticBuffers:
        return self._held[0]

    @property
    def cache(self) -> StaticCache:
        return self._held[0].cache

    @property
    def capacity(self) -> int:
        return self._held[0].capacity

    def _allocate(self, want: int) -> None:
        """A static cache of at least ``want`` slots (a multiple of ``CAPACITY_STEP``), the committed rows copied;
        new frames (and no graphs) for it."""
        capacity = -(-want // CAPACITY_STEP) * CAPACITY_STEP
        text = self.model.config.get_text_config()
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        cache = StaticCache(config=self.model.config, max_cache_len=capacity)
        cache.early_initialization(1, heads, head_dim, self.dtype, self.device)  # before any (compiled) forward
        old = self._held[0]
        if old is not None:
            for new_layer, old_layer in zip(cache.layers, old.cache.layers):
                new_layer.keys[..., :self.length, :] = old_layer.keys[..., :self.length, :]
                new_layer.values[..., :self.length, :] = old_layer.values[..., :self.length, :]
        if self.compiled:  # one graph per bucket whatever the run's length (the capacity is symbolic)
            for layer in cache.layers:
                torch._dynamo.mark_dynamic(layer.keys, 2)
                torch._dynamo.mark_dynamic(layer.values, 2)
        self._held[0] = StaticBuffers(cache, capacity)

    def _frame(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The persistent inputs of a forward of ``rows`` rows: ids (1, rows) int64, positions (1, rows) int64,
        mask (1, 1, rows, capacity) of the model's dtype."""
        frames = self.buffers.frames
        if rows not in frames:
            mask = torch.zeros(1, 1, rows, self.capacity, dtype=self.dtype, device=self.device)
            if self.compiled:
                torch._dynamo.mark_dynamic(mask, 3)
            frames[rows] = (torch.zeros(1, rows, dtype=torch.long, device=self.device),
                            torch.zeros(1, rows, dtype=torch.long, device=self.device), mask)
        return frames[rows]

    def _seek(self, at: int) -> None:
        """Every layer writes its next rows at slot ``at`` (its ``cumulative_length``)."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(at)

    @torch.no_grad()
    def prefill(self, ids: list[int]) -> torch.Tensor:
        if len(ids) + 1 > self.capacity:
            self._allocate(len(ids) + 1)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)  # (1, L)
        self._seek(0)
        logits = self.model(input_ids=x, cache=self.cache, use_cache=True).logits[0]  # (L, |V|): eager, causal
        self.length, self._rows = len(ids), 0
        return logits

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> torch.Tensor:
        n = len(tree)
        rows = bucket(n, self.buckets) if self.buckets else n
        step = self.step if not self.buckets or rows <= self.buckets[-1] else self.model  # beyond: no graph
        if self.length + rows > self.capacity:
            self._allocate(self.length + rows)
        tokens, depths, anc = tree.device_ancestry(self.device)  # (n,), (n,), (n, n) bool
        ids, pos, mask = self._frame(rows)
        low = torch.finfo(self.dtype).min
        at = self.length
        ids[0, :n] = tokens
        pos[0, :n] = depths + at
        mask.fill_(low)  # (1, 1, rows, capacity): nothing attended ...
        mask[0, 0, :, :at] = 0  # ... but the committed prefix, by every row (padding rows: by it alone)
        mask[0, 0, :n, at:at + n].masked_fill_(anc, 0)  # each node: its ancestors and itself
        if rows > n:
            ids[0, n:] = 0
            pos[0, n:] = at
        self._seek(at)
        logits = self._run(step, rows)  # (rows, |V|)
        self._rows = rows
        return logits[:n]  # (n, |V|): padding rows' logits are never read

    def _run(self, step, rows: int) -> torch.Tensor:
        """One forward of the ``rows``-row frame (its inputs already written) by ``step``: (rows, |V|) logits."""
        ids, pos, mask = self._frame(rows)
        return step(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache, use_cache=True).logits[0]

    @torch.no_grad()
    def commit(self, keep: list[int]) -> None:
        k, at = len(keep), self.length
        if keep != list(range(k)):  # rows out of place: gathered, then written at at .. at + k - 1
            src = upload([at + i for i in keep], torch.long, self.device)  # (k,)
            dst = upload(list(range(at, at + k)), torch.long, self.device)  # (k,)
            for layer in self.cache.layers:
                for kv in (layer.keys, layer.values):  # (1, heads, capacity, head_dim) each
                    kv.index_copy_(2, dst, kv.index_select(2, src))
        self.length += k
        self._rows = 0


class StaticPath(ForwardPath):
    """``StaticForward`` for every generation, the model's own forward at each tree's size.

    A generation's buffers (cache, frames, and on the graphed path its CUDA graphs) outlive it: when its forward
    is gone they wait in ``spares`` (at most ``SPARES``) and the next ``open`` that fits takes them, so a later
    generation allocates and captures nothing.  Never two generations at once: a forward still in use keeps its
    buffers.  Stale rows of an earlier generation sit past the committed length and are never attended.
    """

    name = "static"
    buckets: tuple[int, ...] | None = None
    #: Finished generations' buffers kept for the next: two, as the page runs AR beside a generation (each keeps
    #: its own); each is one static cache of the model (SmolLM2-135M, 512 slots, fp32: 24 MB).
    SPARES = 2

    def __init__(self, model) -> None:
        super().__init__(model)
        problem = static_problem(model)
        if problem:
            raise ValueError(f"the static path cannot serve this model: {problem}")
        self.step = model
        self.spares: list[StaticBuffers] = []
        self._lock = threading.RLock()  # a forward's finalizer may run on any thread, in a collection inside take

    def open(self, max_length: int, max_rows: int = 1) -> TreeForward:
        return StaticForward(self, max_length, max_rows)

    def take(self, want: int) -> StaticBuffers | None:
        """The smallest kept buffers of at least ``want`` slots, now this caller's; None when none fits."""
        with self._lock:
            fits = [b for b in self.spares if b.capacity >= want]
            if not fits:
                return None
            chosen = min(fits, key=lambda b: b.capacity)
            self.spares.remove(chosen)
            return chosen

    def keep(self, held: list) -> None:
        """A finished forward's buffers (``held[0]``) kept for the next ``open``; the smallest is dropped past
        ``SPARES``."""
        with self._lock:
            self.spares.append(held[0])
            self.spares.sort(key=lambda b: b.capacity, reverse=True)
            del self.spares[self.SPARES:]


class CompiledPath(StaticPath):
    """The static path with trees padded to ``BUCKETS`` and the model's forward compiled by ``torch.compile``
    (inductor, ``dynamic=False``: one graph per bucket and cache capacity, compiled on its first use; the prefill
    stays eager, as transformers' ``StaticLayer`` asks).  Compiling needs a C++ compiler on a CPU; a failure to
    compile raises on the first forward that needs it (``engine.product.compiled`` warms the buckets up and falls
    back to the eager path with one sentence)."""

    name = "compiled"
    buckets = BUCKETS

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS) -> None:
        super().__init__(model)
        self.buckets = buckets
        self.step = torch.compile(model, dynamic=False)
        self._warm: set[int] = set()  # buckets compiled ahead of any run (engine.product.models.forward_choice.warm)

    def cold_buckets(self) -> tuple[int, ...]:
        return tuple(rows for rows in self.buckets if rows not in self._warm)

    def warmed(self, rows: int) -> None:
        self._warm.add(rows)
