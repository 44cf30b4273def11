"""Verification cost curve T(n): what a tree of n nodes costs, as the decoding loop reads it.

Source: GT principle paper, §3.1 (Eqs. 6-9): a draft node's cost is the extra time it adds to a
cycle, Φ(N) in Eq. 6 (training-free drafters cost next to nothing to draft, M_D ≈ 0): its row in the
verification forward plus harvesting that row's logits into the adjacency table.  ``CostCurve`` holds
T(n) for n tree nodes, as measured on one device (engine/product/cost_cache.py measures and caches it).  Two uses:

* the speedup-optimal tree size (``GtConfig.threshold = "auto"``, engine/decoding/gt.py) reads the
  whole curve;
* the fixed-chord threshold (``gt_threshold = "chord"``) is one number from it,
  c(B) = (T(B) - T(1)) / ((B - 1) T(1)), the mean marginal cost of one node in AR steps.

On a GPU T(n) is flat up to tens of nodes; on a CPU it grows with n, steeply at first.

A curve is identified by ``CostCurve.id``, a hash of its ``spec()``, the compact text that reproduces it exactly
(``python -m engine.product.generate --cost-curve``); ``to_dict`` is its file form, format ``FORMAT``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = 2  # version of the curve file; files of another version are measured again


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
