"""Verification cost curve T(n): what a tree of n nodes costs, as the decoding loop reads it.

Source: GT principle paper, §3.1 (Eqs. 6-9): a draft node's cost is the extra time it adds to a
cycle, Φ(N) in Eq. 6 (training-free drafters cost next to nothing to draft, M_D ≈ 0): its row in the
verification forward plus harvesting that row's logits into the adjacency table.  ``CostCurve`` holds
T(n) for n tree nodes, as measured on one device (engine/product/models/cost_cache.py measures, caches it).
Two uses:

* the speedup-optimal tree size (``GtConfig.threshold = "auto"``, engine/decoding/gt.py) reads the
  whole curve;
* the fixed-chord threshold (``gt_threshold = "chord"``) is one number from it,
  c(B) = (T(B) - T(1)) / ((B - 1) T(1)), the mean marginal cost of one node in AR steps.

On a GPU T(n) is flat up to tens of nodes; on a CPU it grows with n, steeply at first.

A curve is identified by ``CostCurve.id``, a hash of its ``spec()``, the compact text that reproduces it exactly
(``python -m cli.generate --cost-curve``); ``to_dict`` is its file form, format ``FORMAT``.

A curve stays true two ways (ours, not the paper's): ``CostCurve.problem`` checks a fresh measurement (its medians
non-decreasing within noise, its rounds' spread bounded), so a curve taken while the machine was busy is not
cached (engine/product/models/cost_cache.py); and ``refine_curve`` / ``CurveRefiner`` correct a curve from the
verification forwards a run actually made, so a wrong curve corrects itself.
"""
from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = 2  # version of the curve file; files of another version are measured again ("spread" is optional within 2)

#: The noise band of one size's median, in ms: |a - b| ≤ NOISE_REL · b + NOISE_MS is "the same time".  Idle
#: measurements of a size's median on one machine differ by up to ~10 % (results.md, SmolLM2 q4 on 2 cores: T(8)
#: 31.9-34.2 ms, T(16) 46.0-50.1 ms over three measurements), and the curve of record dips by up to 2.3 % where the
#: true cost is flat or rising (T(9) 37.43 > T(10) 36.58 ms); 15 % leaves room for both.  The 0.3 ms covers timer
#: and scheduler jitter on small times (the demo model's T(1) is 5.8 ms, a GPU forward's tail a fraction of a ms).
#: The busy curve of issue 44 (T(2) 107 ms > T(3) 89 ms, T(3) 89 > T(4) 51) is far outside it.
NOISE_REL = 0.15
NOISE_MS = 0.3
#: The most a curve's typical round spread may be: the median over sizes of (interquartile range / median) of a
#: size's timed rounds.  Idle, whole measurements' medians repeat within ~10 % (``NOISE_REL``'s figures), so the
#: middle half of one size's rounds should sit well inside 25 % of their median (an estimate: not measured on an
#: idle machine); the demo model measured on a 2-core machine while another process ran a bench there (2026-11-26)
#: read 0.7 and 2.3.  0.25 flags a machine busy for much of the measurement, not one hiccup (the interquartile
#: range drops the extreme rounds).
MAX_SPREAD = 0.25
#: Observations of one size a refinement needs before it overrides the prior curve there.
MIN_OBSERVATIONS = 5


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
        spread: for each n, the spread of the measurement's timed rounds: interquartile range / median (a
            fraction, rounded to 0.001), as ``round_spread`` gives it; None when unknown (a curve given by hand, a
            spec, a file written before it was kept).  A diagnostic, not a value: ``spec()``, ``id`` and ``==``
            ignore it.

    Raises:
        CostCurveError: sizes not increasing from 1, a time not positive, or a spread of another length or
            negative.
    """

    nodes: tuple[int, ...]
    ms: tuple[float, ...]
    past: int = 128
    key: str = ""
    spread: tuple[float, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.ms) or not self.nodes or self.nodes[0] != 1 \
                or any(b <= a for a, b in zip(self.nodes, self.nodes[1:])) or min(self.ms) <= 0:
            raise CostCurveError("a cost curve needs increasing sizes starting at 1 and a positive time for each")
        if self.spread is not None and (len(self.spread) != len(self.nodes) or min(self.spread) < 0):
            raise CostCurveError("a cost curve's spread needs one non-negative figure per size")

    def problem(self, rel: float = NOISE_REL, abs_ms: float = NOISE_MS, max_spread: float = MAX_SPREAD) -> str | None:
        """Why this freshly measured curve looks taken on a busy machine, in one sentence; None when it looks sound.

        Two checks: the medians are non-decreasing within noise (more rows never cost less, so no size's median may
        exceed a larger size's by more than ``rel`` times the larger one's + ``abs_ms`` ms; the worst pair is named),
        and, when ``spread`` is known, the median over sizes of the rounds' spread is at most ``max_spread``.
        Defaults: ``NOISE_REL``, ``NOISE_MS``, ``MAX_SPREAD`` (their comments say why).
        """
        ms = np.asarray(self.ms, dtype=float)
        worst, excess = None, 0.0
        for i in range(len(ms) - 1):
            j = i + 1 + int(np.argmin(ms[i + 1:]))  # the cheapest larger size
            if ms[i] > ms[j] * (1 + rel) + abs_ms and ms[i] / ms[j] > excess:
                worst, excess = (i, j), ms[i] / ms[j]
        if worst is not None:
            i, j = worst
            return (f"T({self.nodes[i]}) = {ms[i]:.1f} ms exceeds T({self.nodes[j]}) = {ms[j]:.1f} ms by "
                    f"{100 * (excess - 1):.0f} %, beyond the noise band ({100 * rel:.0f} % + {abs_ms} ms)")
        if self.spread is not None:
            typical = float(np.median(self.spread))
            if typical > max_spread:
                return (f"the timed rounds of a size spread by {100 * typical:.0f} % of their median (interquartile "
                        f"range, median over sizes), above the {100 * max_spread:.0f} % an idle machine stays within")
        return None

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
        data = {"format": FORMAT, "id": self.id, "key": self.key, "past": self.past, "nodes": list(self.nodes),
                "ms": list(self.ms), "spec": self.spec()}
        if self.spread is not None:  # optional within format 2: a curve without it writes the file it always did
            data["spread"] = list(self.spread)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> CostCurve:
        """Read ``to_dict()`` output (``spread`` optional: a file without it reads, its curve's spread None).
        Raises ``CostCurveError`` on another format or bad values."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CostCurveError(f"not a cost curve of format {FORMAT}")
        try:
            spread = data.get("spread")
            return cls(tuple(int(n) for n in data["nodes"]), tuple(float(ms) for ms in data["ms"]), int(data["past"]),
                       str(data.get("key", "")), None if spread is None else tuple(float(s) for s in spread))
        except (KeyError, TypeError, ValueError):
            raise CostCurveError("cost-curve file lacks nodes / ms / past") from None


def load_cost_curve(text: str) -> CostCurve:
    """A curve from a ``spec()`` string or a JSON file: a curve file, or a result of ``cli.generate``
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


def round_spread(times: Sequence[float]) -> float:
    """The spread of one size's timed rounds (ms): interquartile range / median, a fraction (numpy's default
    linear-interpolation quartiles, so one extreme round out of 7 barely moves it); 0.0 for fewer than 2 rounds."""
    if len(times) < 2:
        return 0.0
    q1, median, q3 = np.percentile(np.asarray(times, dtype=float), (25, 50, 75))
    return float((q3 - q1) / median) if median > 0 else 0.0


def refine_curve(prior: CostCurve, observed: Mapping[int, Sequence[float]], min_count: int = MIN_OBSERVATIONS,
                 rel: float = NOISE_REL, abs_ms: float = NOISE_MS) -> CostCurve:
    """``prior`` corrected by the verification times a run observed (ours; T(n) itself is the GT principle paper's,
    §3.1 Eq. 6).  Pure: the same arguments give the same curve.

    Args:
        prior: the curve the run started from (measured, cached, or given).
        observed: rows n → the ms of forwards of n rows the run made (what ``T(n)`` prices: one verification
            forward, its read-back and the adjacency store); sizes with fewer than ``min_count`` times are ignored,
            as are times that are not positive.
        min_count, rel, abs_ms: a size with at least ``min_count`` times is an anchor; its median m is compared with
            the prior's T(n) = p, and where |m - p| > ``rel`` · p + ``abs_ms`` (the noise band, ``NOISE_REL`` and
            ``NOISE_MS`` by default) the anchor's ratio is m / p, else 1 (noise within the band is ignored).

    Returns:
        ``prior`` itself when no anchor disagrees with it; else a curve over the prior's sizes and the anchors',
        T(n) = p(n) · r(n), r linear in n between neighbouring anchors and held at the nearest anchor's ratio beyond
        them (an anchor in the band pins its neighbourhood to the prior).  Times rounded to 0.001 ms; same ``past``
        and ``key``; spread None (not measured).
    """
    ratio: dict[int, float] = {}
    for n, times in observed.items():
        times = [t for t in times if t > 0]
        if n >= 1 and len(times) >= min_count:
            m, p = float(np.median(times)), prior.latency(n)
            ratio[int(n)] = m / p if abs(m - p) > rel * p + abs_ms else 1.0
    if all(r == 1.0 for r in ratio.values()):
        return prior
    anchors = sorted(ratio)
    sizes = np.array(sorted(set(prior.nodes) | set(anchors)))
    scale = np.interp(sizes, anchors, [ratio[n] for n in anchors])  # held constant beyond the end anchors
    ms = np.array(prior.latencies(int(sizes[-1])))[sizes - 1] * scale
    return CostCurve(tuple(int(n) for n in sizes), tuple(round(max(float(t), 0.001), 3) for t in ms), prior.past,
                     prior.key)


class CurveRefiner:
    """A run's cost curve, corrected online from its own verification forwards (ours; ``refine_curve`` says how).

    ``observe(rows, ms)`` after each verification forward; ``curve()`` the corrected curve (``prior`` until enough
    forwards of some size disagree with it beyond the noise band).  Keeps the last ``window`` times per size, so the
    correction follows the machine (a median over that window, not over the whole run).

    Raises:
        ValueError: ``window`` < ``min_count`` (no size could ever become an anchor) or ``min_count`` < 1.
    """

    def __init__(self, prior: CostCurve, min_count: int = MIN_OBSERVATIONS, window: int = 32,
                 rel: float = NOISE_REL, abs_ms: float = NOISE_MS) -> None:
        if min_count < 1 or window < min_count:
            raise ValueError(f"a refiner needs 1 <= min_count <= window (got {min_count}, {window})")
        self.prior, self.min_count, self.window, self.rel, self.abs_ms = prior, min_count, window, rel, abs_ms
        self._times: dict[int, deque[float]] = {}
        self._curve: CostCurve | None = prior

    def observe(self, rows: int, ms: float) -> None:
        """Record one verification forward of ``rows`` rows that took ``ms`` ms (ignored unless rows ≥ 1, ms > 0)."""
        if rows >= 1 and ms > 0:
            self._times.setdefault(int(rows), deque(maxlen=self.window)).append(float(ms))
            self._curve = None

    @property
    def observed(self) -> dict[int, list[float]]:
        """Rows → the times kept for that size (ms; the last ``window``), oldest first."""
        return {n: list(times) for n, times in sorted(self._times.items())}

    def curve(self) -> CostCurve:
        """The corrected curve (``refine_curve`` of the prior and ``observed``), recomputed only after a new
        observation; the prior object itself while nothing disagrees with it."""
        if self._curve is None:
            self._curve = refine_curve(self.prior, self._times, self.min_count, self.rel, self.abs_ms)
        return self._curve
