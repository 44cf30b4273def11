"""The cost curve on this machine: measured once per model and device, cached on disk.

Source: GT principle paper, §3.1 (Eq. 6): T(n), the time of one verification forward of n tree nodes plus the
logit harvest (``engine.decoding.cost.CostCurve`` holds it and says how the loop reads it).

Storage: one JSON file per (model, device, dtype, attention kernel, packed linears, torch version) under
``$GOOSE_LENS_CACHE/cost`` (default ~/.cache/goose-lens/cost), format ``FORMAT``, written atomically
(temporary file, then ``os.replace``).  ``measure_cost_curve`` returns a fresh curve and writes nothing: the page's
"re-measure" uses it for one user's session.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ..core.forward import EagerPath, ForwardPath
from ..core.tree import DraftTree, Source
from ..core.verify import read_back
from ..decoding.cost import CostCurve
from ..sources.tr import AdjacencyTable, TrSource
from .paths import cache_root

log = logging.getLogger(__name__)  # start-up steps, for the console (app.py shows INFO)

SIZES = (*range(1, 17), 20, 24, 32, 48, 64, 128)  # every size to 16: a kernel may price rows in blocks (torch's
# 4-bit CPU kernel: T(5) ≈ T(8) ≈ 1.3 T(4) on SmolLM2), and the size choice interpolates between measured sizes
MEASUREMENT = 3  # how a cached curve was measured; a curve of an older one is measured again.  1 timed sizes in a
# fixed order (T(1), right after T(128), read 20 % high); 2 shuffles them each round; 3 times the read-back that
# takes the argmax off an fp32 top-k (0.2-0.8 ms cheaper per forward on a CPU: the old curve overprices trees)


def curve_key(model, path: str = "eager") -> str:
    """What a curve depends on: the model (its folder's or file's name and a hash of where it came from, never
    a path), device, dtype, attention kernel, the layers' own kernels (a module's ``kernel``: packed bf16
    linears, 4-bit ones), torch version and the forward path that runs the trees (``engine.core.forward``: the
    eager path's key is as before, the static and compiled paths add their name)."""
    where = str(model.name_or_path)
    name = f"{Path(where).name or where}#{hashlib.sha1(where.encode()).hexdigest()[:8]}"
    attn = getattr(model.config, "_attn_implementation", None) or "default"
    kernels = "".join(f"|{k}" for k in sorted({getattr(m, "kernel", "") for m in model.modules()} - {""}))
    forward = "" if path == "eager" else f"|{path}"
    return f"{name}|{model.device}|{model.dtype}|{attn}{kernels}|torch {torch.__version__}{forward}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure_cost_curve(model, sizes: tuple[int, ...] = SIZES, past: int = 128, repeats: int = 7,
                       path: ForwardPath | None = None) -> CostCurve:
    """Measure a fresh curve; writes nothing (so a page's re-measure stays in that user's session).

    Per size n: one verification forward of an n-node chain over ``past`` cached tokens, the
    cycle's read-back (argmax and top-K, one device-to-host copy) and the adjacency store, timed as
    the decoding loop runs them.  Sizes are interleaved within each repeat so machine drift hits all
    alike, in a new (seeded) order each round: a forward right after a large one runs slow (its cache and
    allocator state; in a fixed order 1 always followed 128, and T(1) of SmolLM2 in q4 read 24-25 ms against the
    loop's 20), and the median drops the rounds that put a size there.  The first round warms up; ``ms`` is the
    median of ``repeats`` rounds.  ``path``: the forward path the curve is of (``engine.core.forward``; default
    the eager path), so the curve prices the forward that runs (a compiled path's padded buckets included).
    """
    path = path if path is not None else EagerPath(model)
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    forward = path.open(past + max(sizes) + 1, max(sizes))
    forward.prefill(torch.randint(0, vocab, (past,), generator=gen).tolist())
    table = AdjacencyTable(vocab)  # scratch: storing each row is part of a node's cost
    trees = {n: DraftTree(tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()), (None, *range(n - 1)),
                          (Source.ROOT,) + (TrSource.info.source,) * (n - 1), (1.0,) * n, (1.0,) * n) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    order, shuffle = list(sizes), random.Random(0).shuffle
    for _ in range(repeats + 1):  # the first round warms up
        shuffle(order)
        for n in order:
            tree = trees[n]
            _sync(model.device)
            t0 = time.perf_counter()
            back = read_back(forward.verify(tree), table.top_k)  # waits for the device
            table.store([None, *tree.tokens[:-1]], list(tree.tokens), back.successor_ids, back.successor_scores)
            times[n].append((time.perf_counter() - t0) * 1000)
            forward.commit([])
    return CostCurve(tuple(sizes), tuple(round(statistics.median(times[n][1:]), 3) for n in sizes), past,
                     curve_key(model, path.name))


def _path_name(path: ForwardPath | None) -> str:
    return path.name if path is not None else "eager"


def _cache_path(model, cache_dir: str | Path | None, path: ForwardPath | None = None) -> Path:
    folder = cache_root(cache_dir) / "cost"
    return folder / (hashlib.sha1(curve_key(model, _path_name(path)).encode()).hexdigest()[:16] + ".json")


_loaded: dict[Path, CostCurve] = {}  # curves already read in this process (a measurement, no user data)


def cached_cost_curve(model, refresh: bool = False, cache_dir: str | Path | None = None,
                      path: ForwardPath | None = None) -> CostCurve:
    """The model's shared cost curve: read from the disk cache, or measured and stored when absent,
    unreadable, of another format or ``refresh`` (an operator's re-measure: every user of the cache
    sees the new curve; a page visitor's re-measure must use ``measure_cost_curve`` instead), or measured at
    sizes other than ``SIZES`` or by an older ``MEASUREMENT``.  ``path``: the forward path whose curve it is
    (default: the eager one)."""
    file = _cache_path(model, cache_dir, path)
    known = None if refresh else known_cost_curve(model, cache_dir, path)
    if known is not None:
        return known
    log.info("cost curve: timing verification forwards of 1-128 rows (once per machine and model, ~10 s on 2 cores)")
    start = time.perf_counter()
    curve = _loaded[file] = measure_cost_curve(model, path=path)
    log.info("cost curve: T(1) = %.1f ms, T(16) = %.1f ms (measured in %.0f s)", curve.ms[0],
             curve.ms[curve.nodes.index(16)], time.perf_counter() - start)
    write_cost_curve(curve, file)
    return curve


def known_cost_curve(model, cache_dir: str | Path | None = None, path: ForwardPath | None = None) -> CostCurve | None:
    """The model's shared cost curve (of forward ``path``, default eager) when it is measured already (in memory or
    the disk cache, as ``cached_cost_curve`` reads it), else None: never measures (for a thread that must not time
    forwards)."""
    file = _cache_path(model, cache_dir, path)
    if file in _loaded:
        return _loaded[file]
    try:
        data = json.loads(file.read_text())
        curve = CostCurve.from_dict(data)
    except (ValueError, OSError):
        return None  # absent, unreadable or older format: measured when first needed
    if curve.key == curve_key(model, _path_name(path)) and curve.nodes == SIZES \
            and data.get("measurement") == MEASUREMENT:
        _loaded[file] = curve
        return curve
    return None


def write_cost_curve(curve: CostCurve, path: str | Path) -> bool:
    """Write ``curve`` to ``path`` atomically (temporary file in the same folder, then ``os.replace``), so
    a reader never sees a half-written file; the file is stamped with this ``MEASUREMENT``.  Returns False when
    the folder is not writable."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({**curve.to_dict(), "measurement": MEASUREMENT}, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False  # a read-only home still gets the curve, just not cached
    return True
