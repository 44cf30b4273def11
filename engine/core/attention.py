"""Tree attention on sdpa without copying the KV cache: query heads that share a key/value head are packed.

A verification forward always passes a float tree attention mask (``DraftTree.device_inputs``).  With a mask,
transformers' sdpa attention gives each query head its own copy of its key/value head (``repeat_kv``) in every
layer, so a model with grouped-query attention (GQA: g query heads per key/value head) copies its whole KV
cache g-fold in every layer of every multi-row forward; only a one-row forward, an AR step, packs the heads
instead (``pack_gqa``).  ``tree_sdpa_attention`` packs them for n rows too: the g query heads of a key/value
head become one head of g·n query rows, each with its own row of the mask, so sdpa reads the cache as it is.
Every query row sees the same keys, values, scale and mask as before; only the copies are gone.

Measured (SmolLM2-135M: 9 query heads, 3 key/value heads; 2 CPU cores, torch 2.13, bf16): one layer's attention
over 128 cached tokens, 2 / 8 rows, 54 / 76 µs with ``repeat_kv`` against 31 / 54 packed; over 600, 183 / 207
against 83 / 148.  docs/results.md, "Where the time goes", has the model's cost curve and the bench.

The kernel is registered with transformers as ``compat.TREE_SDPA``, "tree_sdpa" (``AttentionInterface``, with
sdpa's mask function), the extension point transformers provides for attention kernels; ``use_tree_sdpa``
switches a model's sdpa to it.  Source: ours (an implementation detail of tree verification, not in the papers).
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from .compat import TREE_SDPA, attention_kernel

#: Arguments sdpa's own path handles and packing does not; a call that carries one goes there unchanged.
_SDPA_ONLY = ("position_bias", "softcap", "s_aux", "sinks", "cache")


def tree_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, with grouped query heads packed when there are several query rows and a mask.

    Args:
        module: the attention layer (its ``num_key_value_groups`` g; 1 or missing: no grouping).
        query: (batch, heads, n, head_dim); key, value: (batch, heads / g, kv_len, head_dim); the model's dtype.
        attention_mask: (batch, 1 or heads, n, kv_len), float (0 attended, finfo.min not) or bool (True attended),
            or None.
        dropout, scaling: as sdpa takes them (dropout is 0 in eval).

    Returns:
        ((batch, n, heads, head_dim) attention output, None), as every transformers attention kernel returns.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, n, dim = query.shape
    if groups == 1 or n == 1 or attention_mask is None or dropout or any(
            kwargs.get(name) is not None for name in _SDPA_ONLY):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kv_heads, kv_len = key.shape[1], key.shape[2]
    packed = query.reshape(batch, kv_heads, groups * n, dim)  # (b, H/g, g·n, d): head h reads key/value head h // g
    if attention_mask.shape[1] == 1:  # one mask for every head: repeated for each of the g packed heads
        mask = attention_mask[:, :, None].expand(batch, 1, groups, n, kv_len).reshape(batch, 1, groups * n, kv_len)
    else:  # a mask per head: grouped as the queries are
        mask = attention_mask.reshape(batch, kv_heads, groups * n, kv_len)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, n, dim).transpose(1, 2).contiguous(), None  # (b, n, H, d)


AttentionInterface.register(TREE_SDPA, tree_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(TREE_SDPA, sdpa_mask)  # prompts and plain forwards: sdpa's masks


def use_tree_sdpa(model) -> bool:
    """Serve ``model``'s sdpa attention with ``tree_sdpa_attention`` where it groups query heads; True if switched.

    A model without grouped-query attention (as many key/value heads as query heads) or on another kernel
    (eager) is left as it is.
    """
    text = model.config.get_text_config()
    kv_heads = getattr(text, "num_key_value_heads", None)
    if attention_kernel(model.config) != "sdpa" or not kv_heads or kv_heads >= text.num_attention_heads:
        return False
    model.set_attn_implementation(TREE_SDPA)
    return True
