"""Losslessness that knows its precision: where a run parts from AR, and whether that is a precision tie.

In fp32 greedy speculative decoding is exact: its token ids equal ``generate(do_sample=False)``.  In half
precision a forward over many rows (a draft tree, a prompt-lookup chain) rounds its matmuls differently
from a one-token AR step, so where AR's own top-two logits are within rounding of each other the two may
pick different tokens; transformers' own prompt lookup parts from AR at the same places.  Such a
divergence is a **precision tie**: the logit of the token AR chose and that of the token the run chose,
both read from AR's own one-token step at that position, are within ``TIE_ULPS`` units in the last place
(ulp) of the dtype at that magnitude.  Anything wider is a **bug**.  The same rule labels the benchmark's
rare fp32 divergences (a gap of 2e-6 at a logit of 16 is one fp32 ulp); the fp32 tests allow none at all:
they compare ids with no tolerance.

How wide a tie may be comes from data: ``scripts/tie_ulps.py`` scores AR's positions again the way a
verification forward does (16 rows at a time over the KV cache) and measures how far the gap between AR's
top token and each runner-up moves, in ulps.  A near-tie flips only when the gap is smaller than that move.
Measured on this CPU (docs/results.md, "Precision ties"): bf16 at most 5 ulps on SmolLM2 (3,072 gaps,
p99.9 4) and 2 on the demo model; fp32 at most 21.  ``TIE_ULPS`` takes the next power of two above the
largest move seen: a run that parts from AR by more than that is a bug.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from engine.core.forward import EagerPath, ForwardPath
from engine.core.tree import DraftTree
from engine.product.models.precision import dtype_name

#: Largest gap, in ulps of the dtype at the chosen logit's magnitude, that a precision tie may have
#: (measured: scripts/tie_ulps.py; docs/results.md "Precision ties").
TIE_ULPS = {torch.bfloat16: 8.0, torch.float16: 8.0, torch.float32: 32.0}  # fp16: as bf16 (no CPU to measure it)


def ulp(value: float, dtype: torch.dtype) -> float:
    """One unit in the last place of ``dtype`` at ``|value|`` (e.g. bf16 at 20.0: 0.125)."""
    if value == 0.0:
        return float(torch.finfo(dtype).tiny)
    return float(torch.finfo(dtype).eps) * 2.0 ** math.floor(math.log2(abs(value)))


@dataclass(frozen=True)
class Divergence:
    """Where a run's tokens first part from AR's, read off AR's own one-token step there.

    Attributes:
        position: index in the generated tokens (0 = the first new token).
        kind: "precision tie", "bug", or "length" (one output is a prefix of the other: a stop differs).
        ar_token, run_token: the two tokens at ``position`` (None for "length").
        ar_logit, run_logit: their logits in AR's own step (floats of the model's dtype).
        gap_ulps: (ar_logit − run_logit) in ulps of the dtype at the larger logit's magnitude; negative where
            the AR run whose logits are read itself ranks the run's token first (two AR paths rounding a tie
            differently): a tie either way while |gap| ≤ ``TIE_ULPS``.
        dtype: the name of the logits' dtype (the model's on torch's paths; fp32 on llama.cpp's).
        exact: no difference is allowed at all: fp32 on torch's kernels (the exact mode), or a forward path whose
            rows are bit-identical in any batch (``ForwardPath.ROWS_EXACT``, llama.cpp's), where a divergence from
            AR on that path is always a bug.
        tie_logits: the path's tie bound in logits (``ForwardPath.TIE_LOGITS``), where ties are judged in logits
            rather than ulps; None otherwise.
    """

    position: int
    kind: str
    ar_token: int | None = None
    run_token: int | None = None
    ar_logit: float | None = None
    run_logit: float | None = None
    gap_ulps: float | None = None
    dtype: str = ""
    exact: bool = False
    tie_logits: float | None = None

    @property
    def is_bug(self) -> bool:
        return self.kind == "bug"

    def to_dict(self) -> dict:
        return asdict(self)

    def sentence(self, decode=None) -> str:
        """One line for people: where the outputs part and both logits there."""
        if self.kind == "length":
            return f"the outputs agree up to token {self.position}, where one of them stops"
        show = (lambda t: repr(decode([t]))) if decode else str
        verdict = "a precision tie" if self.kind == "precision tie" else "NOT a tie (a bug)"
        apart = f"{self.gap_ulps:.1f} ulp of {self.dtype} apart"
        if self.tie_logits is not None:  # a path whose rows part by more than rounding: judged in logits
            apart = (f"{abs(self.ar_logit - self.run_logit):.3g} apart (this path's rows part by up to "
                     f"{self.tie_logits:g})")
        return (f"the outputs part at token {self.position}: AR wrote {show(self.ar_token)} "
                f"(logit {self.ar_logit:.4g}), this run {show(self.run_token)} (logit {self.run_logit:.4g}), "
                f"{apart}: {verdict}")


def first_difference(want: list[int], got: list[int]) -> int | None:
    """Index of the first differing token, the shorter length when one is a prefix of the other, None if equal."""
    if want == got:
        return None
    return next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))


@torch.no_grad()
def ar_logits(model, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """AR's greedy tokens and its own one-token-step logits: ``generate(do_sample=False, output_logits=True)``
    for exactly ``max_new_tokens`` steps (no EOS stop).  Returns (tokens, (steps, |V|) logits, model dtype)."""
    ids = torch.tensor([list(prompt_ids)], device=model.device)
    out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    return out.sequences[0, len(prompt_ids):].tolist(), torch.stack([row[0] for row in out.logits])


@torch.no_grad()
def engine_ar_logits(model, prompt_ids: list[int], tokens: list[int],
                     path: ForwardPath | None = None) -> tuple[list[int], torch.Tensor]:
    """The engine's own AR steps over ``tokens``, replayed: the prefill forward, then one one-node tree per
    token (``TreeForward.verify`` of ``path``, default the eager one: the exact path ``--method ar`` runs).
    Teacher-forced with AR's own tokens, it reproduces that run's logits.  Returns (argmax tokens,
    (len(tokens), |V|) logits, model dtype)."""
    forward = (path if path is not None else EagerPath(model)).open(len(prompt_ids) + len(tokens) + 1)
    rows = [forward.prefill(list(prompt_ids))[-1].clone()]  # (|V|,): a path's buffer is reused by the next forward
    for token in tokens[:-1]:
        rows.append(forward.verify(DraftTree.root_only(token))[0].clone())
        forward.commit([0])
    logits = torch.stack(rows)  # (len(tokens), |V|)
    return logits.argmax(-1).tolist(), logits


@torch.no_grad()
def attribute(model, prompt_ids: list[int], want: list[int], got: list[int],
              logits: torch.Tensor | None = None, path: ForwardPath | None = None) -> Divergence | None:
    """Attribute the first difference of ``got`` (a run) from ``want`` (AR's greedy tokens); None when equal.

    Args:
        model: the transformers causal LM both ran on.
        prompt_ids: the prompt; want, got: the generated ids of AR and of the run.
        logits: (≥ position + 1, |V|) AR's own step logits over ``want`` (``ar_logits`` for ``generate``'s AR,
            ``engine_ar_logits`` for the engine's); None: ``engine_ar_logits`` replays them on ``path``.  Two AR
            paths may round a tie differently, so a tie counts in either direction (``Divergence.gap_ulps``).
        path: the forward path both ran on (None: the eager path, the torch model's own weights).  On a path that
            runs other weights (llama.cpp's on a GGUF file) ``want`` must be AR on that path
            (``reference.lossless_reference``); on one whose rows are bit-identical in any batch
            (``ROWS_EXACT``) every difference is a bug; on one with ``TIE_LOGITS`` a tie is two logits at most that
            far apart.
    """
    i = first_difference(want, got)
    if i is None:
        return None
    rows_exact = path is not None and path.ROWS_EXACT
    bound = path.TIE_LOGITS if path is not None else None  # a path whose rows part by more than rounding
    # the precision the logits are judged in: the model's on torch's paths (``generate`` hands back fp32 copies of
    # bf16 logits: their ulps are bf16's), llama.cpp's fp32 where a path runs the file's own weights
    dtype = torch.float32 if path is not None and path.weights() is not None else model.dtype
    name = dtype_name(dtype)
    if i >= min(len(want), len(got)):
        return Divergence(i, "length", dtype=name, exact=rows_exact or (dtype == torch.float32 and bound is None),
                          tie_logits=bound)
    if logits is None:
        _, logits = engine_ar_logits(model, prompt_ids, list(want[: i + 1]), path)
    row = logits[i]  # (|V|,) AR's own one-token step at position i
    a, b = float(row[want[i]]), float(row[got[i]])
    gap = (a - b) / ulp(max(a, b), dtype)  # negative where this AR run itself rounds the other way
    tie = (abs(a - b) <= bound if bound is not None else abs(gap) <= TIE_ULPS[dtype]) and not rows_exact
    return Divergence(i, "precision tie" if tie else "bug", want[i], got[i], a, b, gap, name,
                      rows_exact or (dtype == torch.float32 and bound is None), bound)
