"""Verification cost curve and the GT threshold c derived from it.

Source: GT principle paper, §3.1 (Eqs. 6-9): a draft node is worth verifying when its estimated
acceptance exceeds the cost coefficient c = M_D / M_T.  Training-free drafters cost next to nothing
to draft (M_D ≈ 0), so a node's cost is the extra time it adds to a cycle, Φ(N) in Eq. 6: its row
in the verification forward plus harvesting that row's logits into the adjacency table.  We
measure that time T(n) for n tree nodes on the current device and take

    c(B) = (T(B) - T(1)) / ((B - 1) * T(1)),

the mean marginal cost of one node, in units of one AR step (the time an accepted token saves).
On a GPU T(n) is flat up to tens of nodes and c is near 0; on a CPU it grows with n and c > 0.
The curve is cached on disk per model, device, dtype and torch version.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from . import kv_cache
from .adjacency import AdjacencyTable
from .tree import DraftTree, Source
from .verify import forward_tree

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
CACHE_ENV = "GOOSE_LENS_CACHE"  # folder for cached cost curves (default ~/.cache/goose-lens)


@dataclass(frozen=True)
class CostCurve:
    """Median verification latency per tree size.

    Attributes:
        nodes: tree sizes n (root included), increasing.
        ms: median ms of one verification forward plus the logit harvest, for each n, over ``past``
            cached tokens.
        past: cached tokens during the measurement.
        key: model | device | dtype | torch version the curve belongs to.
    """

    nodes: tuple[int, ...]
    ms: tuple[float, ...]
    past: int
    key: str

    def latency(self, n: int) -> float:
        """Interpolated forward latency (ms) for n nodes."""
        return float(np.interp(n, self.nodes, self.ms))

    def threshold(self, budget: int, extra_rows: int = 0) -> float:
        """GT threshold c for node budget B (0 when B = 1), clamped to [0, 0.5].

        c = (T(B + R) - T(1 + R)) / ((B - 1) T(1)): the marginal cost of a verified node in AR steps,
        where R rows ride along in every forward anyway (PTD drafting rows; 0 otherwise).
        """
        if budget <= 1:
            return 0.0
        c = (self.latency(budget + extra_rows) - self.latency(1 + extra_rows)) / ((budget - 1) * self.latency(1))
        return float(min(0.5, max(0.0, c)))

    def to_dict(self) -> dict:
        return asdict(self)


def curve_key(model) -> str:
    return f"{model.name_or_path}|{model.device}|{model.dtype}|torch {torch.__version__}"


@torch.no_grad()
def measure_cost_curve(model, sizes: tuple[int, ...] = SIZES, past: int = 128, repeats: int = 5) -> CostCurve:
    """Time one verification forward of n nodes over ``past`` cached tokens plus the harvest of their
    logit rows, per n (median of ``repeats`` after a warm-up)."""
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = kv_cache.new_cache(model, past + max(sizes) + 1)
    prefix = torch.randint(0, vocab, (1, past), generator=gen).to(model.device)
    model(input_ids=prefix, past_key_values=cache, use_cache=True)
    medians = []
    table = AdjacencyTable(vocab, device=model.device)  # scratch: harvesting each row is part of a node's cost
    for n in sizes:
        tokens = tuple(torch.randint(0, vocab, (n,), generator=gen).tolist())
        tree = DraftTree(tokens, (None, *range(n - 1)), (Source.ROOT,) + (Source.TR,) * (n - 1), (1.0,) * n, (1.0,) * n)
        times = []
        for _ in range(repeats + 1):  # the first run warms up
            t0 = time.perf_counter()
            logits = forward_tree(model, cache, tree, past)
            logits.argmax(dim=-1).tolist()  # .tolist() waits for the device
            table.harvest([None, *tokens[:-1]], torch.tensor(tokens), logits)
            times.append((time.perf_counter() - t0) * 1000)
            kv_cache.keep_path(cache, past, [])
        medians.append(statistics.median(times[1:]))
    return CostCurve(tuple(sizes), tuple(medians), past, curve_key(model))


_loaded: dict[Path, CostCurve] = {}  # curves already read in this process (a measurement, no user data)


def cached_cost_curve(model, refresh: bool = False, cache_dir: str | Path | None = None) -> CostCurve:
    """The model's cost curve from the disk cache, measured (and stored) when absent or ``refresh``."""
    folder = Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "goose-lens") / "cost"
    key = curve_key(model)
    path = folder / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")
    if not refresh and path in _loaded:
        return _loaded[path]
    if not refresh and path.exists():
        try:
            data = json.loads(path.read_text())
            _loaded[path] = CostCurve(tuple(data["nodes"]), tuple(data["ms"]), data["past"], data["key"])
            return _loaded[path]
        except (ValueError, KeyError, OSError):
            pass  # unreadable cache: measure again
    curve = _loaded[path] = measure_cost_curve(model)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(curve.to_dict()))
    except OSError:
        pass  # a read-only home still gets the curve, just not cached
    return curve
