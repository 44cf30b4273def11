"""Verification cost curve T(n): what a tree of n nodes costs, measured once per model and device.

Source: GT principle paper, §3.1 (Eqs. 6-9): a draft node's cost is the extra time it adds to a
cycle, Φ(N) in Eq. 6 (training-free drafters cost next to nothing to draft, M_D ≈ 0): its row in the
verification forward plus harvesting that row's logits into the adjacency table.  We measure that
time T(n) for n tree nodes on the current device.  Two uses:

* the speedup-optimal tree size (``GtConfig.threshold = "auto"``, engine/core/gt.py) reads the
  whole curve;
* the fixed-chord threshold (``gt_threshold = "chord"``) is one number from it,
  c(B) = (T(B) - T(1)) / ((B - 1) T(1)), the mean marginal cost of one node in AR steps.

On a GPU T(n) is flat up to tens of nodes; on a CPU it grows with n, steeply at first.

Storage: one JSON file per (model, device, dtype, attention kernel, packed linears, torch version) under
``$GOOSE_LENS_CACHE/cost`` (default ~/.cache/goose-lens/cost), format ``FORMAT``, written atomically
(temporary file, then ``os.replace``).  ``measure_cost_curve`` returns a fresh curve and writes nothing: the page's
"re-measure" uses it for one user's session.  A curve is identified by ``CostCurve.id``, a hash of
its ``spec()``, the compact text that reproduces it exactly (``python -m engine.product.generate --cost-curve``).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..sources.tr import AdjacencyTable, TrSource
from . import kv_cache
from .tree import DraftTree, Source
from .verify import forward_tree, read_back

SIZES = (*range(1, 17), 20, 24, 32, 48, 64, 128)  # every size to 16: a kernel may price rows in blocks (torch's
# 4-bit CPU kernel: T(5) ≈ T(8) ≈ 1.3 T(4) on SmolLM2), and the size choice interpolates between measured sizes
CACHE_ENV = "GOOSE_LENS_CACHE"  # folder for cached cost curves (default ~/.cache/goose-lens)
FORMAT = 2  # version of the curve file; files of another version are measured again
MEASUREMENT = 3  # how a cached curve was measured; a curve of an older one is measured again.  1 timed sizes in a
# fixed order (T(1), right after T(128), read 20 % high); 2 shuffles them each round; 3 times the read-back that
# takes the argmax off an fp32 top-k (0.2-0.8 ms cheaper per forward on a CPU: the old curve overprices trees)


class CostCurveError(ValueError):
    """A cost-curve spec or file cannot be read; the message says why."""


@dataclass(frozen=True)
class CostCurve:
    """Median verification latency per tree size.

    Attributes:
        nodes: tree sizes n (root included), increasing, starting at 1.
        ms: median ms of one verification forward plus the logit harvest, for each n, over ``past``
            cached tokens; rounded to 0.001 ms so ``spec()`` reproduces the curve exactly.
        past: cached tokens during the measurement.
        key: model | device | dtype | attention | packed | torch version the curve belongs to (``curve_key``;
            "" when given by hand).
    """

    nodes: tuple[int, ...]
    ms: tuple[float, ...]
    past: int = 128
    key: str = ""

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.ms) or not self.nodes or self.nodes[0] != 1 \
                or any(b <= a for a, b in zip(self.nodes, self.nodes[1:])) or min(self.ms) <= 0:
            raise CostCurveError("a cost curve needs increasing sizes starting at 1 and a positive time for each")

    def latency(self, n: int) -> float:
        """T(n) in ms: the measured medians made non-decreasing (more rows never cost less; a lower
        median is noise), interpolated linearly, and extended along the last segment beyond the
        largest measured size."""
        return float(self._at(np.array([n]))[0])

    def latencies(self, upto: int) -> list[float]:
        """[T(1), ..., T(upto)] in ms, as ``latency`` gives each, in one pass (the size choice reads them all)."""
        return self._at(np.arange(1, upto + 1)).tolist()

    def _at(self, sizes: np.ndarray) -> np.ndarray:
        ms = np.maximum.accumulate(np.asarray(self.ms, dtype=float))
        out = np.interp(sizes, self.nodes, ms)
        beyond = sizes > self.nodes[-1]
        if len(self.nodes) > 1 and beyond.any():
            slope = (ms[-1] - ms[-2]) / (self.nodes[-1] - self.nodes[-2])
            out[beyond] = ms[-1] + slope * (sizes[beyond] - self.nodes[-1])
        return out

    def max_rows(self, ms: float) -> int:
        """The most rows one forward may carry within ``ms`` (ms): the largest n with T(n) ≤ ``ms`` (``latency``),
        at least 1, searched up to 8× the largest measured size (a flat curve's answer)."""
        return max(1, int(np.count_nonzero(self._at(np.arange(1, 8 * self.nodes[-1] + 1)) <= ms)))

    def threshold(self, budget: int, extra_rows: int = 0) -> float:
        """Fixed-chord GT threshold c for node budget B (0 when B = 1), clamped to [0, 0.5].

        c = (T(B + R) - T(1 + R)) / ((B - 1) T(1)): the mean marginal cost of a verified node in AR
        steps, where R rows ride along in every forward anyway (PTD drafting rows; 0 otherwise).
        """
        if budget <= 1:
            return 0.0
        c = (self.latency(budget + extra_rows) - self.latency(1 + extra_rows)) / ((budget - 1) * self.latency(1))
        return float(min(0.5, max(0.0, c)))

    def spec(self) -> str:
        """Compact exact text of the curve: ``past=128;1:5.123,2:5.301,...`` (sizes : ms)."""
        return f"past={self.past};" + ",".join(f"{n}:{ms:.3f}" for n, ms in zip(self.nodes, self.ms))

    @property
    def id(self) -> str:
        """12 hex digits identifying the curve's values (a hash of ``spec()``)."""
        return hashlib.sha1(self.spec().encode()).hexdigest()[:12]

    @classmethod
    def from_spec(cls, text: str, key: str = "") -> CostCurve:
        """Parse ``spec()`` text.  Raises ``CostCurveError`` on malformed text."""
        try:
            head, _, body = text.strip().partition(";")
            if not head.startswith("past="):
                raise ValueError
            pairs = [item.split(":") for item in body.split(",") if item.strip()]
            return cls(tuple(int(n) for n, _ in pairs), tuple(round(float(ms), 3) for _, ms in pairs),
                       int(head[5:]), key)
        except (ValueError, TypeError):
            raise CostCurveError(f"not a cost-curve spec (want 'past=128;1:5.1,2:5.3,...'): {text[:80]!r}") from None

    def to_dict(self) -> dict:
        """The file form (``FORMAT``): id, spec, key, and the values as lists."""
        return {"format": FORMAT, "id": self.id, "key": self.key, "past": self.past, "nodes": list(self.nodes),
                "ms": list(self.ms), "spec": self.spec()}

    @classmethod
    def from_dict(cls, data: dict) -> CostCurve:
        """Read ``to_dict()`` output.  Raises ``CostCurveError`` on another format or bad values."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CostCurveError(f"not a cost curve of format {FORMAT}")
        try:
            return cls(tuple(int(n) for n in data["nodes"]), tuple(float(ms) for ms in data["ms"]), int(data["past"]),
                       str(data.get("key", "")))
        except (KeyError, TypeError, ValueError):
            raise CostCurveError("cost-curve file lacks nodes / ms / past") from None


def load_cost_curve(text: str) -> CostCurve:
    """A curve from a ``spec()`` string or a JSON file: a curve file, or a result of ``engine.product.generate``
    (its ``cost_curve`` entry).  Raises ``CostCurveError`` when neither reads."""
    if not text.strip().startswith("past="):
        path = Path(text)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CostCurveError(f"cannot read cost curve {path.name!r}: {exc}") from None
        if isinstance(data, dict) and isinstance(data.get("cost_curve"), dict):
            data = data["cost_curve"]
        return CostCurve.from_dict(data)
    return CostCurve.from_spec(text)


def curve_key(model) -> str:
    """What a curve depends on: the model (its folder's or file's name and a hash of where it came from, never
    a path), device, dtype, attention kernel, the layers' own kernels (a module's ``kernel``: packed bf16
    linears, 4-bit ones) and torch version."""
    where = str(model.name_or_path)
    name = f"{Path(where).name or where}#{hashlib.sha1(where.encode()).hexdigest()[:8]}"
    attn = getattr(model.config, "_attn_implementation", None) or "default"
    kernels = "".join(f"|{k}" for k in sorted({getattr(m, "kernel", "") for m in model.modules()} - {""}))
    return f"{name}|{model.device}|{model.dtype}|{attn}{kernels}|torch {torch.__version__}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure_cost_curve(model, sizes: tuple[int, ...] = SIZES, past: int = 128, repeats: int = 7) -> CostCurve:
    """Measure a fresh curve; writes nothing (so a page's re-measure stays in that user's session).

    Per size n: one verification forward of an n-node chain over ``past`` cached tokens, the
    cycle's read-back (argmax and top-K, one device-to-host copy) and the adjacency store, timed as
    the decoding loop runs them.  Sizes are interleaved within each repeat so machine drift hits all
    alike, in a new (seeded) order each round: a forward right after a large one runs slow (its cache and
    allocator state; in a fixed order 1 always followed 128, and T(1) of SmolLM2 in q4 read 24-25 ms against the
    loop's 20), and the median drops the rounds that put a size there.  The first round warms up; ``ms`` is the
    median of ``repeats`` rounds.
    """
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = kv_cache.new_cache(model, past + max(sizes) + 1)
    prefix = torch.randint(0, vocab, (1, past), generator=gen).to(model.device)
    model(input_ids=prefix, past_key_values=cache, use_cache=True)
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
            back = read_back(forward_tree(model, cache, tree, past), table.top_k)  # waits for the device
            table.store([None, *tree.tokens[:-1]], list(tree.tokens), back.successor_ids, back.successor_scores)
            times[n].append((time.perf_counter() - t0) * 1000)
            kv_cache.keep_path(cache, past, [])
    return CostCurve(tuple(sizes), tuple(round(statistics.median(times[n][1:]), 3) for n in sizes), past,
                     curve_key(model))


def _cache_path(model, cache_dir: str | Path | None) -> Path:
    folder = Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "goose-lens") / "cost"
    return folder / (hashlib.sha1(curve_key(model).encode()).hexdigest()[:16] + ".json")


_loaded: dict[Path, CostCurve] = {}  # curves already read in this process (a measurement, no user data)


def cached_cost_curve(model, refresh: bool = False, cache_dir: str | Path | None = None) -> CostCurve:
    """The model's shared cost curve: read from the disk cache, or measured and stored when absent,
    unreadable, of another format or ``refresh`` (an operator's re-measure: every user of the cache
    sees the new curve; a page visitor's re-measure must use ``measure_cost_curve`` instead), or measured at
    sizes other than ``SIZES`` or by an older ``MEASUREMENT``."""
    path = _cache_path(model, cache_dir)
    key = curve_key(model)
    if not refresh and path in _loaded:
        return _loaded[path]
    if not refresh and path.exists():
        try:
            data = json.loads(path.read_text())
            curve = CostCurve.from_dict(data)
            if curve.key == key and curve.nodes == SIZES and data.get("measurement") == MEASUREMENT:
                _loaded[path] = curve
                return curve
        except (ValueError, OSError):
            pass  # unreadable or older format: measure again
    curve = _loaded[path] = measure_cost_curve(model)
    write_cost_curve(curve, path)
    return curve


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
