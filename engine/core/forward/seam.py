"""The one seam that runs the model on a draft tree: a ``TreeForward`` owns one generation's KV cache.

Every forward loop of the project goes through it (the decoding loop, the cost curve's measurement, the replay of
AR's logits for attributing a divergence, the precision's and the thread's timings), so what is timed is what runs.
A ``ForwardPath`` is a model's way of running it, shared by every generation of that model; ``open`` gives one
generation its own ``TreeForward`` (its own cache: nothing is shared between generations running at
once; the static and llama.cpp paths hand a finished generation's buffers to the next: ``pool.Spares``).

One interface (``prefill`` → ``verify`` → ``commit``, the committed ``length``) and the sizes every path shares: the
tree-size buckets a padded path pads to, the static cache's capacity step, the prompt room a path is prepared for.
Each path is its own module of this package (``eager``, ``static``, ``graphs``, ``llamacpp``) and one ``PathSpec``
in ``registry.SPECS``.

Sources: gpt-fast's static KV cache and compiled decode step (the model of a forward that costs its arithmetic);
SGLang's graph runner (trees padded to a captured batch size).  Tree attention as in SpecInfer / Medusa.
"""
from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from ..tree import DraftTree

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
        name: the path's name (``engine.core.forward.registry.SPECS`` holds every path, with its facts).
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
        ``engine.core.forward.graphs``); never called inside a timed run.  Returns the seconds it took (0.0: nothing
        to do, as on every path but the graphed ones).  Raises nothing a forward would not raise."""
        return 0.0

    @abstractmethod
    def open(self, max_length: int, max_rows: int = 1) -> TreeForward:
        """A fresh ``TreeForward`` for a run of at most ``max_length`` committed positions (prompt + new tokens)
        whose trees have at most ``max_rows`` nodes (larger ones still run, the static cache is then regrown)."""


def bucket(n: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket >= ``n`` rows; ``n`` itself beyond the largest."""
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else n


def round_up(n: int, step: int) -> int:
    """``n`` rounded up to a multiple of ``step`` (a cache's capacity, a context's cells, rows a context is sized
    for)."""
    return -(-n // step) * step
