"""The graphed forward path (engine/core/forward/graphs.py), checked on the CPU with a stand-in for CUDA graphs.

``CpuGraphed`` is the graphed path whose "capture" records that it happened and whose "replay" runs the captured
body (``GraphedForward._body``: the frame's inputs built from the control block, then the model) eagerly: what a CUDA
graph replays, minus the GPU.  With it:

* the body builds the static path's ids, positions and mask, so every verification's logits equal the static
  path's bit for bit in fp32 (trees of every shape, padded, at several committed lengths), and a generation gives
  the static path's and ``generate``'s tokens;
* no capture ever happens inside a timed run: not while a decoding ``Stopwatch`` runs (a run longer than the
  prepared capacity runs uncaptured, and the next preparation captures), not inside the one timer
  (``timing.time_forwards``) of the cost curve and the forward choice;
* a replay refuses to run before the previous tree was committed (its logits read back);
* two generations at once hold two sets of buffers, each with its own graphs; the real ``_capture`` (CUDA calls
  replaced by fakes) gives each set its own graph pool, captures in ``capture_error_mode="thread_local"`` and holds
  ``CAPTURE_LOCK``, so two threads never capture at once.
The CUDA tests (tests/test_cuda.py) replay real graphs.
"""
from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch
from conftest import greedy_reference

from engine.core.forward import StaticPath, graphs
from engine.core.forward.graphs import GraphedPath
from engine.core.tree import DraftTree, Source
from engine.decoding import decode
from engine.decoding.config import DecodeConfig
from engine.product.runs.decoder import make_decoder

TR = Source("tr")
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"
TIMED = {"runs": 0}  # decoding stopwatches running now (``Timed``), or the cost curve's timer


class FakeGraph:
    """What ``Captured`` holds, on a CPU: ``replay`` runs the captured body now."""

    def __init__(self, forward, rows: int, replays: list) -> None:
        self.forward, self.rows, self.replays = forward, rows, replays

    def replay(self) -> torch.Tensor:
        self.replays.append(self.rows)
        return self.forward._body(self.rows)


class CpuGraphed(GraphedPath):
    """The graphed path on a CPU: captures recorded as (rows, capacity, timed runs at that moment)."""

    name = "cpu-graphed"  # not registered

    def __init__(self, model, buckets=graphs.BUCKETS) -> None:
        super().__init__(model, buckets)
        self.captures: list[tuple[int, int, int]] = []
        self.replays: list[int] = []

    @classmethod
    def problem(cls, model, gguf=None):
        return None

    def _capture(self, forward, rows):
        self.captures.append((rows, forward.capacity, TIMED["runs"]))
        return FakeGraph(forward, rows, self.replays)


class Timed(decode.Stopwatch):
    """The decoding loop's stopwatch, counting itself in ``TIMED`` from its start until its ``total``."""

    def __init__(self, *args, **kwargs) -> None:
        TIMED["runs"] += 1
        self.open = True
        super().__init__(*args, **kwargs)

    def total(self):
        if self.open:
            TIMED["runs"] -= 1
            self.open = False
        return super().total()


@pytest.fixture
def timed(monkeypatch):
    from engine.product.models import cost_cache

    monkeypatch.setattr(decode, "Stopwatch", Timed)
    real = cost_cache.time_forwards

    def timer(*args, **kwargs):  # the cost curve's timer: running from its first forward to its last
        TIMED["runs"] += 1
        try:
            return real(*args, **kwargs)
        finally:
            TIMED["runs"] -= 1

    monkeypatch.setattr(cost_cache, "time_forwards", timer)
    TIMED["runs"] = 0
    yield TIMED
    assert TIMED["runs"] == 0


def _tree(tokens, parents) -> DraftTree:
    n = len(tokens)
    return DraftTree(tuple(tokens), tuple(parents), (Source.ROOT,) + (TR,) * (n - 1), (1.0,) * n, (1.0,) * n)


TREES = [_tree([5], [None]), _tree([5, 9, 13], [None, 0, 1]),
         _tree([7, 11, 3, 4, 8, 21, 30], [None, 0, 0, 0, 3, 2, 4]),  # branches, a chain of 3 under node 3
         _tree(list(range(40, 59)), [None, *range(18)])]  # 19 rows: padded to 32


def test_the_captured_body_gives_the_static_paths_logits_bit_for_bit(demo_lm):
    model = demo_lm.model
    graphed, static = CpuGraphed(model, buckets=(1, 4, 8, 32)), StaticPath(model)
    static.buckets = graphed.buckets  # the static path padded to the same buckets, on as many slots
    graphed.prepare(64, 32)
    assert sorted({rows for rows, _, _ in graphed.captures}) == [1, 4, 8, 32]
    prompt = demo_lm.encode_prompt(CODE, chat=False)
    a, b = graphed.open(len(prompt) + 64, 32), static.open(graphed.capacity - 32, 32)
    assert a.capacity == b.capacity
    assert torch.equal(a.prefill(prompt), b.prefill(prompt))
    for tree in TREES * 2:  # each tree at two committed lengths
        replays = len(graphed.replays)
        got, want = a.verify(tree), b.verify(tree)
        assert len(graphed.replays) == replays + 1, "a bucketed tree replays its graph"
        assert got.shape == want.shape and torch.equal(got, want)
        n = len(tree)
        assert all(torch.equal(x, y) for x, y in zip(a._frame(a._rows), b._frame(b._rows))), "ids, positions, mask"
        ids, pos, mask = a._frame(a._rows)
        assert bool((ids[:, n:] == 0).all()) and bool((pos[:, n:] == a.length).all())  # padding rows
        assert torch.equal(mask[0, 0, n:, :a.length], torch.zeros_like(mask[0, 0, n:, :a.length]))
        assert bool((mask[0, 0, n:, a.length:] < 0).all()), "a padding row sees the committed prefix alone"
        keep = [0, *range(1, min(3, len(tree)))] if tree.parents[1:3] == (0, 1) else [0]
        a.commit(keep)
        b.commit(keep)
        assert a.length == b.length


def test_a_generation_on_graphs_gives_generates_tokens_and_captures_outside_every_timed_run(demo_lm, timed):
    model = demo_lm.model
    path = CpuGraphed(model)
    ids = demo_lm.encode_prompt(CODE, chat=False)
    config = DecodeConfig.of(max_new_tokens=48)
    want = greedy_reference(model, ids, 48, demo_lm.eos_token_ids)
    for _ in range(2):
        traces = list(make_decoder(model, config, demo_lm.eos_token_ids, forward=path).generate(ids))
        assert [t for c in traces for t in c.new_tokens] == want
    assert sum(len(t.accepted) for t in traces) > 0, "inconclusive: no draft accepted"
    assert path.captures and all(running == 0 for _, _, running in path.captures), path.captures
    assert len(path.replays) >= 2 * (len(traces) - 1) - 2, "cycles replay graphs"
    captured = len(path.captures)
    list(make_decoder(model, config, demo_lm.eos_token_ids, forward=path).generate(ids))
    assert len(path.captures) == captured, "prepared buffers serve later runs without a capture"


def test_a_run_past_the_prepared_capacity_runs_uncaptured_and_the_next_preparation_captures(demo_lm, timed):
    model = demo_lm.model
    path = CpuGraphed(model, buckets=(1, 2, 4, 8, 16))
    config = DecodeConfig.of(max_new_tokens=24)
    ids = (demo_lm.encode_prompt(CODE, chat=False) * 200)[:graphs.GRAPH_CAPACITY]  # longer than any prepared run
    decoder = make_decoder(model, config, demo_lm.eos_token_ids, forward=path)
    prepared = {cap for _, cap, _ in path.captures}
    assert prepared == {graphs.GRAPH_CAPACITY}
    replays = len(path.replays)
    want = greedy_reference(model, ids, 24, demo_lm.eos_token_ids)
    assert [t for c in decoder.generate(ids) for t in c.new_tokens] == want
    assert len(path.replays) == replays, "no graph on that run's buffers: none replayed, none captured"
    assert all(running == 0 for _, _, running in path.captures)
    make_decoder(model, config, demo_lm.eos_token_ids, forward=path)
    assert path.capacity > graphs.GRAPH_CAPACITY and {cap for _, cap, _ in path.captures} > prepared
    assert all(running == 0 for _, _, running in path.captures)
    list(make_decoder(model, config, demo_lm.eos_token_ids, forward=path).generate(ids))
    assert len(path.replays) > replays


def test_the_cost_curve_is_captured_before_its_timer_at_the_runs_capacity(demo_lm, timed):
    from engine.product.models.cost_cache import measure_cost_curve

    path = CpuGraphed(demo_lm.model, buckets=(1, 2, 4, 8))
    curve = measure_cost_curve(demo_lm.model, sizes=(1, 2, 3, 8), repeats=1, path=path)
    assert curve.nodes == (1, 2, 3, 8) and path.replays
    assert path.captures and all(running == 0 for _, _, running in path.captures)
    assert {cap for _, cap, _ in path.captures} == {path.capacity}  # the capacity a page run replays on


def test_a_replay_waits_for_the_last_trees_commit(demo_lm):
    path = CpuGraphed(demo_lm.model, buckets=(1, 4))
    path.prepare(32, 4)
    forward = path.open(32, 4)
    forward.prefill([1, 2, 3])
    forward.verify(TREES[1])
    with pytest.raises(RuntimeError, match="commit the verified tree"):
        forward.verify(TREES[1])  # would write over logits not read back yet
    forward.commit([0])
    forward.verify(TREES[0])


def test_two_generations_at_once_hold_two_sets_each_with_its_own_graphs(demo_lm):
    path = CpuGraphed(demo_lm.model, buckets=(1, 2, 4))
    path.prepare(64, 4)
    assert len(path.spares) == path.SPARES and len(path.captures) == 3 * path.SPARES
    a, b = path.open(64, 4), path.open(64, 4)
    assert a.buffers is not b.buffers and a.graphs.keys() == b.graphs.keys() == {1, 2, 4}
    assert all(a.graphs[r] is not b.graphs[r] for r in (1, 2, 4))
    path.prepare(64, 4)  # both sets are held: one more is prepared for a third generation
    assert len(path.captures) == 3 * (path.SPARES + 1)


class _FakeCuda:
    """torch.cuda's calls in ``GraphedPath._capture``, recorded on a CPU."""

    def __init__(self) -> None:
        self.graphs: list[dict] = []
        self.inside = 0  # captures under way
        self.overlap = False

    def install(self, monkeypatch) -> None:
        stream = type("Stream", (), {"wait_stream": lambda self, other: None})
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream())
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
        monkeypatch.setattr(torch.cuda, "graph", self.graph)

    @contextlib.contextmanager
    def graph(self, graph, pool=None, stream=None, capture_error_mode="global"):
        self.inside += 1
        self.overlap |= self.inside > 1
        self.graphs.append({"pool": pool, "mode": capture_error_mode, "thread": threading.get_ident()})
        time.sleep(0.02)  # long enough for another thread to try meanwhile
        yield
        self.inside -= 1


def test_captures_use_a_pool_per_set_thread_local_mode_and_one_lock(demo_lm, monkeypatch):
    fake = _FakeCuda()
    fake.install(monkeypatch)
    paths = [type("P", (GraphedPath,), {"problem": classmethod(lambda cls, model, gguf=None: None)})(
        demo_lm.model, buckets=(1, 2)) for _ in range(2)]
    threads = [threading.Thread(target=p.prepare, args=(32, 2)) for p in paths]  # e.g. the picker's thread
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake.graphs) == 2 * 2 * GraphedPath.SPARES and not fake.overlap, "captures never overlap"
    assert {g["mode"] for g in fake.graphs} == {"thread_local"}
    pools = {id(b.runner.pool) for p in paths for b in p.spares}
    assert len(pools) == 2 * GraphedPath.SPARES, "one graph pool per set of buffers"
    assert all(b.runner.graphs.keys() == {1, 2} for p in paths for b in p.spares)


def test_a_paths_preparation_before_a_run_is_said_on_the_console(demo_lm, caplog):
    """Issue 72 item 3: each ZeroGPU call captures its buckets again; make_decoder says how long, outside the run's
    clock (a CPU stand-in whose preparation takes 0.3 s, named as the graphed path)."""
    import logging

    from engine.core.forward import StaticPath
    from engine.decoding.config import DecodeConfig
    from engine.product.runs.decoder import make_decoder

    class SlowToPrepare(StaticPath):
        name = "graphed"

        def prepare(self, max_length: int, max_rows: int = 1) -> float:
            return 0.3

    config = DecodeConfig.of(max_new_tokens=4, gt_threshold=0.1)
    with caplog.at_level(logging.INFO, logger="engine.product.runs.decoder"):
        make_decoder(demo_lm.model, config, forward=SlowToPrepare(demo_lm.model))
    assert "forward path graphed: CUDA graphs captured before the run in 0.30 s" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="engine.product.runs.decoder"):
        make_decoder(demo_lm.model, config, forward=StaticPath(demo_lm.model))
    assert "before the run" not in caplog.text  # nothing to prepare: nothing said


def test_the_fused_step_captured_gives_the_fused_static_paths_logits_and_generates_tokens(demo_lm, timed):
    """graphed-fused (issue 72) on the CPU stand-in: the captured body, its inputs built from the control block, runs
    the fused step as the fused static path runs it (bit for bit), and a Goose generation on it is lossless."""
    from engine.core.forward.fused import FusedPath, GraphedFusedPath

    class CpuGraphedFused(CpuGraphed, GraphedFusedPath):
        name = "cpu-graphed-fused"  # not registered

    model = demo_lm.model
    graphed, fused = CpuGraphedFused(model, buckets=(1, 4, 8, 32)), FusedPath(model)
    fused.buckets = graphed.buckets
    graphed.prepare(64, 32)
    prompt = demo_lm.encode_prompt(CODE, chat=False)
    a, b = graphed.open(len(prompt) + 64, 32), fused.open(graphed.capacity - 32, 32)
    a.prefill(prompt)
    b.prefill(prompt)
    for tree in TREES:
        assert torch.equal(a.verify(tree), b.verify(tree))
        a.commit([0])
        b.commit([0])
    config = DecodeConfig(max_new_tokens=24)
    traces = list(make_decoder(model, config, (), forward=graphed).generate(prompt))
    assert [t for c in traces for t in c.new_tokens] == greedy_reference(model, prompt, 24)
    assert sum(len(c.accepted) for c in traces) > 0, "inconclusive: no draft token was accepted"
