"""Every KV-cache operation of the engine, in one module over the transformers 5 cache API.

Tested with transformers >=5.0,<6 (``DynamicCache`` whose ``crop`` takes a negative count).
Only full-attention ``DynamicLayer`` caches are supported (sliding-window models while the run fits in
their window); linear-attention layers cannot be compacted to a tree path and are refused clearly.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class UnsupportedCacheError(RuntimeError):
    """The model's cache has layers that tree verification cannot compact (sliding window, linear attention)."""


def new_cache(model, max_length: int | None = None) -> DynamicCache:
    """An empty ``DynamicCache`` of full-attention layers for ``model``.

    Sliding-window layers are replaced by full-attention ones when the whole run fits in the window
    (``max_length`` = prompt + new tokens + one tree), where both attend to the same keys; the tree
    mask passed to every forward is full attention anyway.

    Raises:
        UnsupportedCacheError: the model has linear-attention / indexed layers, or a sliding window
            shorter than ``max_length`` (or ``max_length`` unknown).
    """
    cache = DynamicCache(config=model.config)
    sliding = [layer for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]
    other = [type(layer).__name__ for layer in cache.layers
             if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer)]
    if other:
        raise UnsupportedCacheError(
            f"tree verification needs full-attention KV caches; this model has {sorted(set(other))} layers")
    if sliding:
        window = min(layer.sliding_window for layer in sliding)
        if max_length is None or max_length > window:
            raise UnsupportedCacheError(
                f"this model uses a sliding attention window of {window} tokens; tree verification supports it only "
                f"while prompt + new tokens stay within the window (asked for {max_length})")
        cache = DynamicCache()  # full-attention layers, created lazily per layer
    return cache


def cache_length(cache: DynamicCache) -> int:
    """Number of cached positions (tokens)."""
    return cache.get_seq_length()


def keep_path(cache: DynamicCache, past_len: int, keep: list[int]) -> None:
    """Compact the cache after a tree forward to ``past + keep``.

    Args:
        cache: holds ``past_len`` committed positions followed by the n rows of the last tree forward.
        past_len: committed length before that forward.
        keep: indices (0-based within the n tree rows) of the nodes to keep, in path order.

    After the call the cache holds ``past_len + len(keep)`` positions: the committed past followed by
    the kept rows' keys and values (gather, then truncate).  A kept prefix ``0..k-1`` is a plain crop.
    """
    n_new = cache_length(cache) - past_len
    if keep == list(range(len(keep))):  # rows already in place (chains, AR): truncate only
        if n_new > len(keep):
            cache.crop(-(n_new - len(keep)))
        return
    rows_on: dict[torch.device, torch.Tensor] = {}  # (k,) kept rows, uploaded once per device (no host sync)
    kept = []
    for layer in cache.layers:
        device = layer.keys.device
        if device not in rows_on:
            rows_on[device] = torch.tensor([past_len + i for i in keep], dtype=torch.long, device=device)
        rows = rows_on[device]
        kept.append((layer.keys.index_select(-2, rows), layer.values.index_select(-2, rows)))  # (b, h, k, d) each
    cache.crop(-n_new)
    for layer_idx, (k, v) in enumerate(kept):
        cache.update(k, v, layer_idx)
