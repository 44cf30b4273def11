"""Sampling mode: the target distribution of a logit row, warped exactly as ``model.generate`` does.

Temperature, top-k and top-p are applied by transformers' own logits warpers, in the order
``generate`` applies them (temperature -> top-k -> top-p), on float32 logits, then softmax; so
lossless here means "the distribution ``generate(do_sample=True, ...)`` samples from".
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .config import DecodeConfig


def _warpers(cfg: DecodeConfig) -> LogitsProcessorList:
    """transformers' warpers for ``cfg``, in ``generate``'s order.  Raises ValueError for a greedy ``cfg``."""
    if not cfg.sampling:
        raise ValueError("sampling warper asked for a greedy configuration (temperature 0)")
    warpers = LogitsProcessorList([TemperatureLogitsWarper(cfg.sampler.temperature)])
    if cfg.sampler.top_k > 0:
        warpers.append(TopKLogitsWarper(cfg.sampler.top_k))
    if cfg.sampler.top_p < 1.0:
        warpers.append(TopPLogitsWarper(cfg.sampler.top_p))
    return warpers


def make_warper(cfg: DecodeConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return ``probs(logits_row)``: (|V|,) logits of any float dtype -> (|V|,) float64 CPU probabilities.

    On an accelerator each call copies its row to the host (a sync): the decoder uses it on a CPU, where the
    walk warps only the rows it visits, and for the prefill's first token; on an accelerator a cycle's rows
    come back together (``make_rows_warper``).

    Raises:
        ValueError: ``cfg`` is greedy (temperature 0).
    """
    warpers = _warpers(cfg)
    empty = torch.empty((1, 0), dtype=torch.long)

    def probs(row: torch.Tensor) -> torch.Tensor:
        scores = warpers(empty.to(row.device), row.to(torch.float32)[None])  # (1, |V|) float32
        return torch.softmax(scores, dim=-1)[0].to("cpu", torch.float64)  # (|V|,)

    return probs


def make_rows_warper(cfg: DecodeConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return ``probs(logits)``: (n, |V|) logits of any float dtype -> (n, |V|) float32 probabilities, row by row
    the distribution ``make_warper`` gives (the same warpers on float32 rows, then softmax), left on the logits'
    device, with no host sync: the decoder on an accelerator copies a cycle's rows to the host in its one
    read-back (``verify.read_back``), where ``.double()`` of a row equals ``make_warper``'s result for it.

    Raises:
        ValueError: ``cfg`` is greedy (temperature 0).
    """
    warpers = _warpers(cfg)

    def probs(rows: torch.Tensor) -> torch.Tensor:
        ids = torch.empty((rows.shape[0], 0), dtype=torch.long, device=rows.device)  # (n, 0): no context needed
        return torch.softmax(warpers(ids, rows.to(torch.float32)), dim=-1)  # (n, |V|) float32

    return probs


def new_generator(seed: int) -> torch.Generator:
    """CPU generator for every random draw of one generation (acceptance tests and bonus tokens)."""
    return torch.Generator(device="cpu").manual_seed(seed)
