"""One timer for every measurement that chooses something, and one form for the files that cache them.

The forward path (``forward_choice``), the precision (``precision``) and the cost curve (``cost_cache``) all time
verification forwards the same way (``time_forwards``):

* every (forward, size) pair once per round, in a new seeded order each round: a forward right after a large one
  runs slow (its cache and allocator state; in a fixed order T(1), right after T(128), read 20 % high), and machine
  drift hits every pair alike;
* the first round warms up (a compiled or graphed path builds its bucket there) and is dropped;
* a device sync before each forward, then the forward and the decoding loop's own read-back (``read_back`` with the
  adjacency table's top-k, one host copy that waits for the device) and the table's store: what ``T(n)`` prices
  (GT principle paper, §3.1 Eq. 6: a node's row plus harvesting its logits);
* each size timed where a run meets it, between AR steps: after a one-row step (the one that ended the forward's pair
  before; the warm-up round's first is dropped), and the one-row step after it timed too; ``T(n)`` is the n-row
  forward plus what the step after it costs over a one-row step after a one-row step, and ``T(1)`` a one-row step
  after one.  A forward path that rebuilds its work on a new batch shape charges the rebuild to the tree that
  caused it, on both sides: llama.cpp reuses its compute graph only for a batch of the shape before
  (``llm_graph_params::allow_reuse`` in ``src/llama-graph.h``), so on the llamacpp path an AR step in a run of them
  costs ~1 ms less than one after a tree, which pays its own graph and leaves the next step a new one
  (docs/results.md, "The cost curve");
* medians and their spread (``engine.decoding.cost.round_spread``) per pair.

Their cache files share one helper (``read_cache`` / ``write_cache``): one JSON file per key under the cache root,
stamped with a format number and the key, written atomically (a temporary file in the same folder, then
``os.replace``), so a reader never sees half a file and a file of another stamp is measured again.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.forward import TreeForward
from engine.core.tree import DraftTree
from engine.core.verify import read_back
from engine.decoding.cost import round_spread
from engine.product.models.paths import cache_root
from engine.sources.tr import AdjacencyTable, TrSource


@dataclass(frozen=True)
class Timings:
    """ms of each timed round (the warm-up dropped) per (forward name, rows) pair; ``first``: seconds of the warm-up
    forward of each pair (a compile or a capture lands there)."""

    times: Mapping[tuple[Hashable, int], list[float]]
    first: Mapping[tuple[Hashable, int], float]

    def median(self, name: Hashable, rows: int) -> float:
        """Median ms of ``name``'s forwards of ``rows`` rows, rounded to 0.001 ms."""
        return round(statistics.median(self.times[(name, rows)]), 3)

    def spread(self, name: Hashable, rows: int) -> float:
        """Interquartile range / median of those rounds (``round_spread``), rounded to 0.001."""
        return round(round_spread(self.times[(name, rows)]), 3)

    def medians(self, sizes: tuple[int, ...]) -> dict:
        """{name: [median ms at each of ``sizes``]}."""
        names = dict.fromkeys(name for name, _ in self.times)
        return {name: [self.median(name, n) for n in sizes] for name in names}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def time_forwards(forwards: Mapping[Hashable, TreeForward], sizes: tuple[int, ...], vocab: int,
                  device: torch.device | str, repeats: int = 7, seed: int = 0) -> Timings:
    """Time one verification forward of a chain of each of ``sizes`` rows on each prefilled forward, as the module
    docstring says (interleaved pairs in a new order each round, each between one-row steps and charged what the
    step after it costs over one in a run of them, a sync, the loop's read-back and store, the warm-up round
    dropped).  Each forward's cache is left as it was (every tree is dropped: ``commit([])``).

    Args:
        forwards: name -> a ``TreeForward`` with its prefix already committed, room for ``max(sizes)`` more rows.
        sizes: tree sizes n (rows), each >= 1.
        vocab: |V| of the model(s); the chains' tokens are drawn below it (seeded: the same on every machine).
        device: where the forwards run (synced before each forward on CUDA).
        repeats: timed rounds after the warm-up one.
        seed: the chains' tokens and the rounds' orders.

    Returns:
        ``Timings`` of ``repeats`` rounds per (name, n), n = 1 included: ms per verification forward as a run pays
        it (the n-row forward + the step after it − a one-row step after a one-row step).
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    sizes = tuple(sorted({1, *sizes}))  # a one-row step after a one-row step: the base of every size's rounds
    trees = {n: DraftTree.chain(torch.randint(0, vocab, (n,), generator=gen).tolist(), TrSource.info.source)
             for n in sizes}
    table = AdjacencyTable(vocab)  # scratch: storing each row is part of a node's cost, as in the loop
    pairs = [(name, n) for name in forwards for n in sizes]
    times: dict[tuple[Hashable, int], list[float]] = {pair: [] for pair in pairs}
    first: dict[tuple[Hashable, int], float] = {}  # the warm-up round's forwards alone (s): a compile lands there
    shuffle = random.Random(seed).shuffle
    for _ in range(repeats + 1):
        shuffle(pairs)
        rounds = {}  # (name, n) -> (ms of the n rows, ms of the one-row step after them)
        for name, n in pairs:  # each forward's step before is the one-row step that ended its pair before
            forward = forwards[name]
            rounds[(name, n)] = (_timed(forward, trees[n], table, device), _timed(forward, trees[1], table, device))
            first.setdefault((name, n), rounds[(name, n)][0] / 1000)
        for (name, n), (ms, after) in rounds.items():  # plus what the step after costs over a step in a run
            times[(name, n)].append(ms + after - rounds[(name, 1)][0])
    return Timings({pair: row[1:] for pair, row in times.items()}, first)


def _timed(forward: TreeForward, tree: DraftTree, table: AdjacencyTable, device: torch.device) -> float:
    """ms of one verification of ``tree`` with the loop's read-back and store (``time_forwards``); the tree is
    dropped after (``commit([])``), the cache left as it was."""
    _sync(device)
    t0 = time.perf_counter()
    back = read_back(forward.verify(tree), table.top_k)  # waits for the device
    table.store([None, *tree.tokens[:-1]], list(tree.tokens), back.successor_ids, back.successor_scores)
    ms = (time.perf_counter() - t0) * 1000
    forward.commit([])
    return ms


def cache_file(kind: str, key: str, cache_dir: str | Path | None = None) -> Path:
    """The cache file of measurement ``kind`` ("cost", "forward", "precision") for ``key`` (never a path: a hash
    names the file) under the cache root."""
    return cache_root(cache_dir) / kind / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")


def read_cache(file: Path, **stamp) -> dict | None:
    """The JSON object in ``file`` when every ``stamp`` item matches its own (e.g. ``format=2, key=...``), else None
    (absent, unreadable, another stamp: measured again)."""
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or any(data.get(k) != v for k, v in stamp.items()):
        return None
    return data


def write_cache(file: Path, data: dict) -> bool:
    """Write ``data`` as JSON to ``file`` atomically (a temporary file in the same folder, then ``os.replace``).
    Returns False when the folder is not writable (a read-only cache only costs a measurement next time)."""
    file = Path(file)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=file.name, suffix=".tmp", dir=file.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, file)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True
