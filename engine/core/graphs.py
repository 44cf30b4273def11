"""The static forward captured as CUDA graphs: one graph per tree-size bucket, replayed each cycle.

On a GPU a small model's forward is launch-bound: the host issues a few hundred kernels per forward, each costing
more host time than device time (SmolLM2-135M on an H100: 19 ms of launches for a forward of well under 1 ms of
kernels).  A CUDA graph records the kernels of one forward once and replays them with one launch.  The static path
(``engine.core.forward``) already keeps every address a forward touches fixed: the static KV cache and the
per-bucket input frames (token ids, positions, the tree attention mask).  ``GraphedForward`` captures the model's
forward on those frames the first time a bucket is used on them (warm-up on a side stream, then capture into the
path's one memory pool, as SGLang's graph runner and torch's ``make_graphed_callables`` do) and replays it
afterwards; a cycle only writes the tree's tokens, positions and mask into the frame first.  The graphs stay with
the buffers, which a finished generation hands to the next (``StaticPath``): a capture costs 0.12-0.15 s per bucket
for SmolLM2's shape on an H100, more than all the replays of a short generation.  transformers' ``StaticLayer`` writes
each forward's rows at its ``cumulative_length`` tensor, which the replay reads where it is, so the write slot
follows the committed length without recapture.

A capture that fails (an op that cannot be captured, memory) falls back to the plain static forward for that
bucket, with one sentence in the log; the replay's output is the captured logits buffer, read before the next
replay.  No host sync is added: the cycle's one read-back stays the only one.

Sources: PyTorch's "CUDA Graphs" notes (``torch.cuda.graph``, warm-up on a side stream, shared memory pools);
SGLang's ``cuda_graph_runner`` (capture per batch size, largest first, inputs copied into captured buffers);
gpt-fast (static cache + compiled decode step).  Ours: capturing tree verification per bucket on this cache.
"""
from __future__ import annotations

import logging

import torch

from .forward import BUCKETS, StaticForward, StaticPath, register

log = logging.getLogger(__name__)


class GraphedForward(StaticForward):
    """``StaticForward`` whose bucketed forwards replay CUDA graphs captured on its buffers' cache and frames; the
    graphs go with the buffers (``StaticBuffers.graphs``) to the next generation, which replays them without a new
    capture, and are dropped with them when the cache regrows.
    """

    def __init__(self, path: GraphedPath, max_length: int, max_rows: int) -> None:
        self.path = path
        super().__init__(path, max_length, max_rows)

    @property
    def graphs(self) -> dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor] | None]:
        """rows -> (the captured ``torch.cuda.CUDAGraph``, its (rows, |V|) logits buffer); a bucket whose capture
        failed maps to None (run without a graph)."""
        return self.buffers.graphs

    def _run(self, step, rows: int) -> torch.Tensor:
        if rows > self.buckets[-1]:  # beyond the largest bucket: no graph
            return super()._run(step, rows)
        if rows not in self.graphs:
            self.graphs[rows] = self._capture(rows)
        captured = self.graphs[rows]
        if captured is None:
            return super()._run(step, rows)
        graph, logits = captured
        graph.replay()
        return logits

    def _capture(self, rows: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        """Capture the ``rows``-row forward on this cache's frame (its inputs already hold this cycle's tree).
        Warm-up runs and the capture write their rows at the committed length, as the forward itself does; each
        is preceded by a seek there, so the cache ends as one forward leaves it."""
        at = self.length
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: lazy initialisation and kernel selection happen outside the capture
                    self._seek(at)
                    super()._run(self.model, rows)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            self._seek(at)
            with torch.cuda.graph(graph, pool=self.path.pool(), stream=stream):
                logits = super()._run(self.model, rows)  # (rows, |V|): the replay's output buffer
        except Exception as exc:  # noqa: BLE001 - any capture failure: this bucket runs without a graph
            log.warning("CUDA graph capture of %d rows failed (%s); that size runs without a graph", rows,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self._seek(at)
            return None
        self._seek(at)
        return graph, logits


@register
class GraphedPath(StaticPath):
    """The static path with each bucket's forward captured as a CUDA graph (``GraphedForward``), lazily, into one
    memory pool per path; the graphs stay with their buffers, which a finished generation hands to the next
    (``StaticPath``), so only a bucket not yet used on them is captured.  CUDA only.

    Raises:
        ValueError: the model is not on a CUDA device, or the static path cannot serve it.
    """

    name = "graphed"

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS) -> None:
        if torch.device(model.device).type != "cuda":
            raise ValueError("CUDA graphs need a model on a CUDA device")
        super().__init__(model)
        self.buckets = buckets
        self._pool = None

    @classmethod
    def problem(cls, model, gguf=None) -> str | None:
        return None if torch.device(model.device).type == "cuda" else "CUDA graphs need a model on a CUDA device"

    def pool(self):
        """The memory pool every capture of this path shares (``torch.cuda.graph_pool_handle``)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def open(self, max_length: int, max_rows: int = 1) -> GraphedForward:
        return GraphedForward(self, max_length, max_rows)
