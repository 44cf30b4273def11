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

What the loop reads is a *fit* of the raw medians, never the medians themselves (``CostCurve.fit``, ours):

1. a size whose median sits beyond the noise band above a larger size's is *slow* (a kernel choice that is
   reproducible on the machine, e.g. SmolLM2 fp32 on an AVX2 CPU: T(3) above T(4)-T(6)): its trees are verified
   padded to the next size that is not slow (``verify_rows``; padding rows see only the committed prefix and their
   logits are never read), and priced there: the lower envelope min over m >= n of T(m);
2. the other sizes get a running median of three (``median3``: one median far off both neighbours takes the nearer
   one's place), then the weighted isotonic (non-decreasing) regression, each size weighted by the inverse square of
   its rounds' spread (``isotonic``: pool-adjacent-violators), so a noisy median is outvoted or averaged with its
   neighbours instead of lifting every larger size to itself (a running maximum did);
3. beyond the largest size the fit goes on along a robust slope: the median of its last three segments' slopes.

The file keeps the raw medians and their spread; the fit is recomputed from them.

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
from functools import cached_property
from pathlib import Path

import numpy as np

FORMAT = 2  # version of the curve file; files of another version are measured again ("spread" is optional within 2)

#: The noise band of one size's median, in ms: |a - b| ≤ NOISE_REL · b + NOISE_MS is "the same time".  15 % leaves
#: room for idle measurements' drift and the small dips of a curve whose true cost is flat or rising, 0.3 ms for
#: timer and scheduler jitter on small times, and a busy machine's curve stays far outside it (the figures:
#: docs/results.md, "The cost curve").
NOISE_REL = 0.15
NOISE_MS = 0.3
#: The absolute part of the band is at most this fraction of T(1): a 1 ms GPU forward and a 130 ms CPU forward are
#: judged alike (0.3 ms alone would pass a high median of a graphed GPU's T(1) as noise).
NOISE_T1 = 0.05
#: A median's relative spread is floored at this when it weights the fit, so one size timed in unusually tight
#: rounds does not pin the whole fit to itself.
MIN_WEIGHT_SPREAD = 0.02
#: The most a curve's typical round spread may be: the median over sizes of (interquartile range / median) of a
#: size's timed rounds.  Idle, whole measurements' medians repeat within ``NOISE_REL``, so the middle half of one
#: size's rounds should sit well inside 25 % of their median (an estimate), and a curve measured beside another
#: process's work reads far above it (docs/results.md, "The cost curve").  0.25 flags a machine busy for much of the
#: measurement, not one hiccup (the interquartile range drops the extreme rounds).
MAX_SPREAD = 0.25
#: Observations of one size a refinement needs before it overrides the prior curve there.
MIN_OBSERVATIONS = 5
#: A run's forward is compared with T(n) only when its context (cached tokens) is within this fraction of the
#: curve's ``past``: a forward's time grows with its context (the demo model's one-row step: 2.67 ms below 64 cached
#: tokens, 2.89 at 128-191, 3.12 at 256-319), so short prompts would pull T(n) low (docs/results.md, "Every
#: default, after a fresh measurement and after a refinement").
CONTEXT_TOLERANCE = 0.5
#: Sizes ``CostCurve.latency`` reads from a table computed once: past every tree a decoder opens (B ≤ 128 nodes
#: plus ride-along rows); a larger size is computed as it is asked.
TABLE_ROWS = 256


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
        abs_ms = min(abs_ms, NOISE_T1 * ms[0])
        worst, excess = None, 0.0
        for i in range(len(ms) - 1):
            j = i + 1 + int(np.argmin(ms[i + 1:]))  # the cheapest larger size
            if ms[i] > ms[j] * (1 + rel) + abs_ms and ms[i] / ms[j] > excess:
                worst, excess = (i, j), ms[i] / ms[j]
        if worst is not None:
            i, j = worst
            return (f"T({self.nodes[i]}) = {ms[i]:.1f} ms exceeds T({self.nodes[j]}) = {ms[j]:.1f} ms by "
                    f"{100 * (excess - 1):.0f} %, beyond the noise band ({100 * rel:.0f} % + {abs_ms:.3g} ms)")
        fit = self.fit
        for i in range(1, len(ms) - 1):  # far above the fit of both neighbours: twice the band
            near = max(fit[i - 1], fit[i + 1])
            if ms[i] > near * (1 + 2 * rel) + 2 * abs_ms:
                return (f"T({self.nodes[i]}) = {ms[i]:.1f} ms sits far above its neighbours' fit ({near:.1f} ms), "
                        f"beyond twice the noise band")
        if self.spread is not None:
            typical = float(np.median(self.spread))
            if typical > max_spread:
                return (f"the timed rounds of a size spread by {100 * typical:.0f} % of their median (interquartile "
                        f"range, median over sizes), above the {100 * max_spread:.0f} % an idle machine stays within")
        return None

    def band(self, ms: float, rel: float = NOISE_REL, abs_ms: float = NOISE_MS) -> float:
        """The noise band (ms) around a median of ``ms`` ms on this curve's device: ``rel`` · ms plus ``abs_ms``, the
        latter at most ``NOISE_T1`` · T(1) (timer jitter scales with the device's own step)."""
        return rel * ms + min(abs_ms, NOISE_T1 * self.ms[0])

    @cached_property
    def slow(self) -> tuple[int, ...]:
        """Measured sizes whose median exceeds a larger size's beyond the noise band (``band``), the larger sizes
        read through a running median of three (``median3``, so one low median cannot make its smaller neighbours
        look slow): more rows cost less there, so their trees verify padded (``verify_rows``)."""
        ms, later = self.ms, median3(self.ms)
        return tuple(n for i, n in enumerate(self.nodes[:-1])
                     if ms[i] > min(later[i + 1:]) + self.band(min(later[i + 1:])))

    @cached_property
    def fit(self) -> tuple[float, ...]:
        """The fitted T(n) at each measured size (ms): over the sizes that are not ``slow``, a running median of
        three (one median far off its neighbours is replaced by theirs), then the weighted isotonic regression
        (``isotonic``; weights 1 / spread², spread floored at ``MIN_WEIGHT_SPREAD``; equal without a spread); a slow
        size carries the fit of the next size that is not slow, where it is verified.  Non-decreasing in n."""
        keep = [i for i, n in enumerate(self.nodes) if n not in self.slow]
        spread = self.spread or (MIN_WEIGHT_SPREAD,) * len(self.nodes)
        weights = [1.0 / max(spread[i], MIN_WEIGHT_SPREAD) ** 2 for i in keep]
        fitted = dict(zip(keep, isotonic(median3([self.ms[i] for i in keep]), weights)))
        out, nxt = [0.0] * len(self.nodes), None
        for i in reversed(range(len(self.nodes))):  # the last size is never slow
            nxt = i if i in fitted else nxt
            out[i] = fitted[nxt]
        return tuple(out)

    def raw(self, n: int) -> float:
        """The raw median at ``n`` rows (ms), interpolated linearly between measured sizes and held beyond the
        largest: what was measured, not what the loop prices (``latency``)."""
        return float(np.interp(n, self.nodes, self.ms))

    def verify_rows(self, n: int) -> int:
        """Rows a forward of ``n`` rows is verified as: ``n``, or where the largest measured size at most ``n`` is
        ``slow``, the next measured size that is not (cheaper here; the extra rows are padding)."""
        if not self.slow:
            return n
        below = [m for m in self.nodes if m <= n]
        if n >= self.nodes[-1] or not below or below[-1] not in self.slow:
            return n
        return next(m for m in self.nodes if m > n and m not in self.slow)

    def latency(self, n: int) -> float:
        """T(n) in ms as the loop prices it: the ``fit`` at ``verify_rows(n)``, interpolated linearly between
        measured sizes that are not slow, and extended beyond the largest along a robust slope (the median of the
        last three segments').  ``n`` may be a mean number of rows (a float)."""
        table = self._table
        if type(n) is int and 1 <= n <= len(table):
            return table[n - 1]
        return float(self._at(np.array([n]))[0])  # a size past the table, or a mean number of rows

    def latencies(self, upto: int) -> list[float]:
        """[T(1), ..., T(upto)] in ms, as ``latency`` gives each, in one pass (the size choice reads them all)."""
        table = self._table
        return list(table[:upto]) if upto <= len(table) else self._at(np.arange(1, upto + 1)).tolist()

    @cached_property
    def _table(self) -> tuple[float, ...]:
        """T(1) .. T(``TABLE_ROWS``) as ``_at`` gives them, computed once: the loop reads T(n) twice a cycle, and a
        lookup costs a tuple index where ``_at`` costs tens of µs of numpy calls."""
        return tuple(self._at(np.arange(1, TABLE_ROWS + 1)).tolist())

    @cached_property
    def _knots(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(sizes that are not slow, their fit, the slope beyond the last) for ``_at``."""
        keep = [i for i, n in enumerate(self.nodes) if n not in self.slow]
        x = np.asarray([self.nodes[i] for i in keep], dtype=float)
        y = np.asarray([self.fit[i] for i in keep], dtype=float)
        slopes = np.diff(y)[-3:] / np.diff(x)[-3:] if len(x) > 1 else np.zeros(1)
        return x, y, float(np.median(slopes))

    def _at(self, sizes: np.ndarray) -> np.ndarray:
        x, y, slope = self._knots
        rows = sizes.copy()
        for n in self.slow:  # n up to the next size that is not slow: verified (and priced) as that size
            pad = self.verify_rows(n)
            rows[(sizes >= n) & (sizes < pad)] = pad
        out = np.interp(rows, x, y)
        beyond = rows > x[-1]
        if beyond.any():
            out[beyond] = y[-1] + slope * (rows[beyond] - x[-1])
        return out

    def max_rows(self, ms: float) -> int:
        """The most rows one forward may carry within ``ms`` (ms): the largest n with T(n) ≤ ``ms`` (``latency``),
        at least 1, searched up to 8× the largest measured size (a flat curve's answer)."""
        return max(1, int(np.count_nonzero(self._at(np.arange(1, 8 * self.nodes[-1] + 1)) <= ms)))

    def row_price(self, extra_rows: int = 0) -> float:
        """What a tree's first draft row costs, in AR steps: (T(2 + R) - T(1 + R)) / T(1 + R), R rows riding along
        in every forward (PTD drafting rows; 0 otherwise).  0.7-0.9 on llama.cpp's kernels on 2 CPU cores, about 0.7 for
        torch's fp32 on an AVX2 CPU, 0.03 to 0.25 for its bf16 on an AVX-512 one, 0.1 for a CUDA graph
        (docs/results.md, "GT on a flat curve")."""
        one = self.latency(1 + extra_rows)
        return (self.latency(2 + extra_rows) - one) / one

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
        """The file form (``FORMAT``): id, spec, key, the raw medians (and spread) as lists, and, for a reader, the
        fit GT reads at each size and the padded size of each slow one (derived from the medians; not read back)."""
        data = {"format": FORMAT, "id": self.id, "key": self.key, "past": self.past, "nodes": list(self.nodes),
                "ms": list(self.ms), "spec": self.spec()}
        if self.spread is not None:  # optional within format 2: a curve without it writes the file it always did
            data["spread"] = list(self.spread)
        data["fit"] = [round(v, 3) for v in self.fit]  # what GT reads at each size (derived; never read back)
        if self.slow:
            data["verified_as"] = {str(n): self.verify_rows(n) for n in self.slow}
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


def median3(values: Sequence[float]) -> list[float]:
    """Tukey's running median of three (*Exploratory Data Analysis*, 1977, ch. 7): each inner value replaced by the
    median of itself and its two neighbours, the end values kept (T(1), an AR step's price, stays as measured).  A
    monotone run passes unchanged; one value off both its neighbours takes the nearer one's place."""
    out = [float(v) for v in values]
    for i in range(1, len(values) - 1):
        out[i] = float(sorted(values[i - 1:i + 2])[1])
    return out


def isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators: a block whose mean
    exceeds the next block's is merged with it, means weighted by ``weights``).  Source: Ayer et al. (1955), Barlow
    et al., *Statistical Inference under Order Restrictions* (1972), §1.2; the same fit as SciPy's
    ``optimize.isotonic_regression`` (not a dependency here for 20 lines)."""
    blocks: list[list[float]] = []  # [weighted mean, total weight, count]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [m for m, _, c in blocks for _ in range(c)]


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
            Sizes are the rows the forwards really ran (``verify_rows``: padding included).
        min_count, rel, abs_ms: a size with at least ``min_count`` times is an anchor; its median m is compared with
            the prior's raw median there p (interpolated between measured sizes), and where m is outside the noise
            band (``CostCurve.band``: ``NOISE_REL`` and ``NOISE_MS`` by default) the anchor's ratio is m / p, else 1
            (noise within the band is ignored).

    Returns:
        ``prior`` itself when no anchor disagrees with it; else a curve of *raw* medians over the prior's sizes and
        the anchors', T(n) = p(n) · r(n), r linear in n between neighbouring anchors and held at the nearest anchor's
        ratio beyond them (an anchor in the band pins its neighbourhood to the prior).  Never the prior's fit: a
        refined curve is fitted again when read, so it keeps no plateau the medians lack.  Times rounded to
        0.001 ms; same ``past``, ``key`` and ``spread`` (the prior's rounds).
    """
    ratio: dict[int, float] = {}
    for n, times in observed.items():
        times = [t for t in times if t > 0]
        if n >= 1 and len(times) >= min_count:
            m, p = float(np.median(times)), prior.raw(n)
            ratio[int(n)] = m / p if abs(m - p) > prior.band(p, rel, abs_ms) else 1.0
    if all(r == 1.0 for r in ratio.values()):
        return prior
    anchors = sorted(ratio)
    sizes = np.array(sorted(set(prior.nodes) | set(anchors)))
    scale = np.interp(sizes, anchors, [ratio[n] for n in anchors])  # held constant beyond the end anchors
    ms = np.array([prior.raw(int(n)) for n in sizes]) * scale
    spread = None
    if prior.spread is not None:  # the prior's rounds at its own sizes, interpolated at an anchor it never measured
        spread = tuple(round(float(v), 3) for v in np.interp(sizes, prior.nodes, prior.spread))
    return CostCurve(tuple(int(n) for n in sizes), tuple(round(max(float(t), 0.001), 3) for t in ms), prior.past,
                     prior.key, spread)


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
