"""The static paths: transformers' ``StaticCache`` allocated once for the run, and its compiled form.

* ``"static"``: the cache allocated for the run (the prompt, the new tokens and the largest tree) and initialised
  before any forward; each tree's rows are written at the committed length and the 4D tree attention mask
  ``(1, 1, n, capacity)`` lets every row see the committed prefix and its own ancestors, so the slots past them (rows
  of earlier trees) are never read.  The shapes of a forward depend on the tree size alone.
* ``"compiled"``: the static path with each tree padded to a bucket size (``seam.BUCKETS``) and the model's forward
  compiled by ``torch.compile`` (inductor), one graph per bucket: the shapes a compiled graph needs stay fixed.
  Padding rows carry token 0 at the committed length's position and see only the committed prefix, so no real row
  sees them and their logits are never read (tests/test_forward.py checks both).

A finished generation's buffers wait in the path's ``pool.Spares`` for the next generation that fits.

Sources: gpt-fast's static KV cache and compiled decode step (the model of a forward that costs its arithmetic);
SGLang's graph runner (trees padded to a captured batch size, inputs copied into fixed buffers); transformers'
``StaticCache`` (``early_initialization``: the cache exists before any compiled call).  Ours: the bucket set and the
commit of a tree path into a static cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from ..transfer import upload
from ..tree import DraftTree
from .pool import Lease, Spares
from .seam import BUCKETS, CAPACITY_STEP, ForwardPath, TreeForward, bucket, round_up


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
        runner: the graphed path's ``graphs.GraphRunner`` on this cache and these frames (its CUDA graphs, the
            control blocks they read, their memory pool); None on every other path.
        kv: (2 · layers, 1, kv heads, capacity, head dim), every layer's keys and values (layer i's ``keys`` and
            ``values`` are its views 2i and 2i + 1), so a commit moves the kept rows of every layer in two operations
            (``pack_layers``); None on a compiled path (its graphs keep transformers' own tensors) or where the layers
            differ in shape.
    """

    cache: StaticCache
    capacity: int
    frames: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    runner: object = None
    kv: torch.Tensor | None = None


def initialised_cache(model, slots: int) -> StaticCache:
    """transformers' ``StaticCache`` of ``slots`` slots for ``model``, initialised in the model's dtype on its device
    (``early_initialization``: its tensors exist before any forward, compiled or not)."""
    text = model.config.get_text_config()
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    cache = StaticCache(config=model.config, max_cache_len=slots)
    cache.early_initialization(1, heads, head_dim, model.dtype, torch.device(model.device))
    return cache


def pack_layers(cache: StaticCache) -> torch.Tensor | None:
    """Every layer's keys and values of an initialised ``cache`` moved into one tensor, (2 · layers, 1, kv heads,
    capacity, head dim), each layer's ``keys`` and ``values`` becoming its views 2i and 2i + 1 (their contents
    copied; transformers' ``StaticLayer`` writes through the views as before).  Returns the tensor, or None, the cache
    left as it was, when the layers differ in shape, dtype or device (a model whose layers are not alike)."""
    first = cache.layers[0].keys
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    if any(t.shape != first.shape or t.dtype != first.dtype or t.device != first.device for t in tensors):
        return None
    kv = torch.stack(tensors)  # (2 · layers, 1, kv heads, capacity, head dim)
    for i, layer in enumerate(cache.layers):
        layer.keys, layer.values = kv[2 * i], kv[2 * i + 1]
    return kv


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
        self.compiled = path.compiles  # a compiled step: every size that may vary is marked dynamic
        self.device, self.dtype = torch.device(self.model.device), self.model.dtype
        self.length = 0
        self._rows = 0  # rows (padding included) of the last verified tree
        want = max_length + (bucket(max_rows, self.buckets) if self.buckets else max_rows)
        # a finished generation's buffers when large enough, else new ones; they serve the next when this one is done
        self._lease: Lease[StaticBuffers | None] = Lease(self, path.take(want), path.keep)
        if self._lease.value is None:
            self._allocate(want)

    def release(self) -> None:
        """Hand this forward's buffers to the path now (``StaticPath.keep``), as its end would; use it no more."""
        self._lease.release()

    @property
    def buffers(self) -> StaticBuffers:
        return self._lease.value

    @property
    def cache(self) -> StaticCache:
        return self._lease.value.cache

    @property
    def capacity(self) -> int:
        return self._lease.value.capacity

    def _allocate(self, want: int) -> None:
        """A static cache of at least ``want`` slots (a multiple of ``CAPACITY_STEP``), the committed rows copied;
        new frames (and no graphs) for it."""
        capacity = round_up(want, CAPACITY_STEP)
        cache = initialised_cache(self.model, capacity)  # before any (compiled) forward
        old = self._lease.value
        if old is not None:
            for new_layer, old_layer in zip(cache.layers, old.cache.layers):
                new_layer.keys[..., :self.length, :] = old_layer.keys[..., :self.length, :]
                new_layer.values[..., :self.length, :] = old_layer.values[..., :self.length, :]
        kv = None
        if self.compiled:  # one graph per bucket whatever the run's length (the capacity is symbolic)
            for layer in cache.layers:
                torch._dynamo.mark_dynamic(layer.keys, 2)
                torch._dynamo.mark_dynamic(layer.values, 2)
        else:  # a commit moves every layer's kept rows at once
            kv = pack_layers(cache)
        self._lease.value = StaticBuffers(cache, capacity, kv=kv)

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
            packed = self.buffers.kv
            if packed is not None:  # every layer's keys and values at once: (2 · layers, 1, heads, capacity, head_dim)
                packed.index_copy_(3, dst, packed.index_select(3, src))
            else:
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
    compiles = False  # its step is the model, or a module of plain operations (the fused step), never compiled
    #: Finished generations' buffers kept for the next: two, as the page runs AR beside a generation (each keeps
    #: its own); each is one static cache of the model (SmolLM2-135M, 512 slots, fp32: 24 MB).
    SPARES = 2

    def __init__(self, model) -> None:
        super().__init__(model)
        problem = static_problem(model)
        if problem:
            raise ValueError(f"the static path cannot serve this model: {problem}")
        self.step = model
        self.spares: Spares[StaticBuffers] = Spares(self.SPARES, rank=lambda b: b.capacity)  # largest kept first

    def open(self, max_length: int, max_rows: int = 1) -> TreeForward:
        return StaticForward(self, max_length, max_rows)

    def take(self, want: int) -> StaticBuffers | None:
        """The smallest kept buffers of at least ``want`` slots, now this caller's; None when none fits."""
        return self.spares.take(lambda b: b.capacity >= want, best=lambda b: b.capacity)

    def keep(self, buffers: StaticBuffers) -> None:
        """A finished forward's buffers kept for the next ``open``; the smallest is dropped past ``SPARES``."""
        self.spares.keep(buffers)


class CompiledPath(StaticPath):
    """The static path with trees padded to ``BUCKETS`` and the model's forward compiled by ``torch.compile``
    (inductor, ``dynamic=False``: one graph per bucket and cache capacity, compiled on its first use; the prefill
    stays eager, as transformers' ``StaticLayer`` asks).  Compiling needs a C++ compiler on a CPU; a failure to
    compile raises on the first forward that needs it (``engine.product.models.forward_choice.warm`` compiles the
    buckets ahead of any run, and a failed compile falls back to the eager path with one sentence)."""

    name = "compiled"
    buckets = BUCKETS
    compiles = True

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS) -> None:
        super().__init__(model)
        self.buckets = buckets
        self.step = torch.compile(model, dynamic=False)
        self._warm: set[int] = set()  # buckets compiled ahead of any run (engine.product.models.forward_choice.warm)

    def cold_buckets(self) -> tuple[int, ...]:
        return tuple(rows for rows in self.buckets if rows not in self._warm)

    def warmed(self, rows: int) -> None:
        self._warm.add(rows)
