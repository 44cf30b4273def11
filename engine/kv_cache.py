"""Every KV-cache operation of the engine, in one module over the transformers 5 cache API.

Tested with transformers >=5.0,<6 (``DynamicCache`` whose ``crop`` takes a negative count).
Only full-attention ``DynamicLayer`` caches are supported: sliding-window and linear-attention
layers cannot be compacted to an arbitrary tree path, and are refused with a clear error.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class UnsupportedCacheError(RuntimeError):
    """The model's cache has layers that tree verification cannot compact (sliding window, linear attention)."""


def new_cache(model) -> DynamicCache:
    """An empty ``DynamicCache`` for ``model``; raises UnsupportedCacheError for non-full-attention layers."""
    cache = DynamicCache(config=model.config)
    bad = [type(layer).__name__ for layer in cache.layers
           if not isinstance(layer, DynamicLayer) or isinstance(layer, DynamicSlidingWindowLayer)]
    if bad:
        raise UnsupportedCacheError(
            f"tree verification needs full-attention KV caches; this model has {sorted(set(bad))} layers")
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
    idx = torch.tensor(keep, dtype=torch.long)
    kept = []
    for layer in cache.layers:
        rows = idx.to(layer.keys.device) + past_len
        kept.append((layer.keys.index_select(-2, rows), layer.values.index_select(-2, rows)))  # (b, h, k, d) each
    cache.crop(-n_new)
    for layer_idx, (k, v) in enumerate(kept):
        cache.update(k, v, layer_idx)
