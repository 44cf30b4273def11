"""Every KV-cache operation of the engine, in one module over the transformers 5 cache API.

Tested with transformers >=5.0,<6 (``DynamicCache`` whose ``crop`` takes a negative count).
Only full-attention ``DynamicLayer`` caches are supported (sliding-window models while the run fits in
their window); linear-attention layers cannot be compacted to a tree path and are refused clearly.  Which
models and runs qualify, and the sentence a refusal gives, is decided in ``engine/core/compat.py`` from the facts
here (``unsupported_layers``, ``sliding_window``); ``new_cache`` only re-checks them.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .transfer import upload


class UnsupportedCacheError(RuntimeError):
    """The model's cache has layers that tree verification cannot compact (sliding window, linear attention)."""


def unsupported_layers(config) -> list[str]:
    """Class names (sorted, distinct) of the cache layers transformers builds for ``config`` that hold no plain
    per-token keys and values, so cannot be compacted to a tree path: recurrent / linear-attention / convolution
    state (``LinearAttentionLayer``, ``LinearAttentionAndFullAttentionLayer``, ...), placeholders of layers that
    share another layer's KV (``DummyLayer``), indexed layers.  [] when every layer is full or sliding attention."""
    return sorted({type(layer).__name__ for layer in DynamicCache(config=config).layers
                   if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer)})


def sliding_window(config) -> int | None:
    """The shortest sliding (or chunked) attention window among ``config``'s cache layers, in tokens; None when
    every layer attends to the whole past."""
    windows = [layer.sliding_window for layer in DynamicCache(config=config).layers
               if isinstance(layer, DynamicSlidingWindowLayer)]
    return min(windows) if windows else None


def new_cache(model, max_length: int | None = None) -> DynamicCache:
    """An empty ``DynamicCache`` of full-attention layers for ``model``.

    Sliding-window layers are replaced by full-attention ones when every position the run reaches is within
    the window (``max_length``: the highest position any forward uses, plus one), where both attend to the same
    keys; the tree mask passed to every forward is full attention anyway.  The decoder refuses a run that does
    not fit and trims its trees to the window before this is called (``compat.PositionLimits``).

    Raises:
        UnsupportedCacheError: the model has linear-attention / shared / indexed layers, or a sliding window
            shorter than ``max_length`` (or ``max_length`` unknown).
    """
    other = unsupported_layers(model.config)
    if other:
        raise UnsupportedCacheError(
            f"tree verification needs per-token KV caches; this model has {other} layers")
    window = sliding_window(model.config)
    if window is not None:
        if max_length is None or max_length > window:
            raise UnsupportedCacheError(
                f"this model uses a sliding attention window of {window} tokens; tree verification supports it only "
                f"while every position stays within the window (asked for {max_length})")
        return DynamicCache()  # full-attention layers, created lazily per layer
    return DynamicCache(config=model.config)


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
    the kept rows' keys and values.  The kept rows are gathered and written in place over the tree's first
    ``len(keep)`` rows (a copy of k rows per layer; re-adding them through ``DynamicCache.update`` would copy
    the whole cache again), then the rest is cropped.  A kept prefix ``0..k-1`` is a plain crop.
    """
    n_new = cache_length(cache) - past_len
    k = len(keep)
    if keep != list(range(k)):  # rows out of place: move them to past_len .. past_len + k - 1
        rows_on: dict[torch.device, torch.Tensor] = {}  # (k,) kept rows, uploaded once per device (no host sync)
        for layer in cache.layers:
            device = layer.keys.device
            if device not in rows_on:
                rows_on[device] = upload([past_len + i for i in keep], torch.long, device)  # CUDA: pinned, non-blocking
            rows = rows_on[device]
            for kv in (layer.keys, layer.values):  # (b, h, past + n, d) each
                kv[..., past_len:past_len + k, :] = kv.index_select(-2, rows)  # (b, h, k, d), gathered before the write
    if n_new > k:
        cache.crop(-(n_new - k))
