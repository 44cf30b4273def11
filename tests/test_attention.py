"""tree_sdpa (engine/core/attention.py): sdpa with grouped query heads packed, not key/value heads repeated.

Per layer it must give what transformers' sdpa gives for the same query rows, mask and cache; a whole model on it
must decode token for token as ``generate(do_sample=False)`` (tests/test_lossless.py runs a tiny Qwen2 on it).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.core import attention, compat
from engine.core.tree import DraftTree, Source


def _inputs(dtype, n=5, past=40, heads=9, kv_heads=3, dim=16, mask_heads=1, bool_mask=False):
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(1, n, heads, dim, generator=gen).transpose(1, 2).to(dtype)  # (1, H, n, d), as layers pass it
    key, value = (torch.randn(1, kv_heads, past + n, dim, generator=gen).to(dtype) for _ in range(2))
    tree = DraftTree(tuple(range(n)), (None, 0, 0, 1, 1)[:n], (Source.ROOT,) * n, (1.0,) * n, (1.0,) * n)
    mask = tree.attention_mask(past, dtype, "cpu").expand(1, mask_heads, n, past + n)  # (1, 1 or H, n, past + n)
    if bool_mask:
        mask = mask == 0
    return SimpleNamespace(num_key_value_groups=heads // kv_heads), query, key, value, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_heads,bool_mask", [(1, False), (9, False), (1, True)])
def test_packed_heads_give_sdpa_s_output(dtype, mask_heads, bool_mask):
    module, query, key, value, mask = _inputs(dtype, mask_heads=mask_heads, bool_mask=bool_mask)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = attention.tree_sdpa_attention(module, query, key, value, mask, scaling=0.25)
    assert got.shape == want.shape == (1, 5, 9, 16)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 if dtype == torch.float32 else 0)


def test_one_row_and_ungrouped_heads_go_to_sdpa_unchanged():
    for n, heads in ((1, 9), (5, 3)):
        module, query, key, value, mask = _inputs(torch.float32, n=n, heads=heads)
        want, _ = sdpa_attention_forward(module, query, key, value, mask)
        assert torch.equal(attention.tree_sdpa_attention(module, query, key, value, mask)[0], want)


def _tiny(kv_heads: int, attn: str = "sdpa") -> Qwen2ForCausalLM:
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=kv_heads,
                                        attn_implementation=attn)).eval()


def test_only_grouped_sdpa_models_are_switched():
    grouped, ungrouped, eager = _tiny(2), _tiny(4), _tiny(2, "eager")
    assert attention.use_tree_sdpa(grouped) and compat.attention_kernel(grouped.config) == compat.TREE_SDPA
    assert not attention.use_tree_sdpa(ungrouped) and compat.attention_kernel(ungrouped.config) == "sdpa"
    assert not attention.use_tree_sdpa(eager) and compat.attention_kernel(eager.config) == "eager"
    assert compat.model_problem(grouped) is None  # a kernel that takes the float tree mask


def test_prompt_forward_on_tree_sdpa_equals_sdpa():
    """A prompt (no mask given: sdpa's own mask function builds it) scores as on sdpa."""
    torch.manual_seed(0)
    model = _tiny(2)
    ids = torch.randint(0, 64, (1, 12))
    want = model(input_ids=ids).logits
    attention.use_tree_sdpa(model)
    torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=0, atol=1e-6)
