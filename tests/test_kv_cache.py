"""KV-cache compaction to the accepted path equals a fresh prefill of the accepted sequence."""
from __future__ import annotations

import pytest
import torch

from engine.core import kv_cache
from engine.core.tree import DraftTree, Source
from engine.core.verify import forward_tree


def layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("path", [[0, 2, 5], [0, 1], [0], [0, 3, 4, 6]])
@torch.no_grad()
def test_keep_path_equals_fresh_prefill(demo_lm, path):
    model = demo_lm.model
    prompt = demo_lm.encode_prompt("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n")
    cache = kv_cache.new_cache(model)
    model(input_ids=torch.tensor([prompt[:-1]]), cache=cache, use_cache=True)
    past = kv_cache.cache_length(cache)
    #        0(root)  1     2     3     4     5     6
    tree = DraftTree(tokens=(prompt[-1], 11, 12, 13, 14, 15, 16), parents=(None, 0, 0, 0, 3, 2, 4),
                     sources=(Source.ROOT,) + (Source("tr"),) * 6, scores=(1.0,) * 7, est_accept=(1.0,) * 7)
    forward_tree(model, cache, tree, past)
    assert kv_cache.cache_length(cache) == past + len(tree)
    kv_cache.keep_path(cache, past, path)
    assert kv_cache.cache_length(cache) == past + len(path)

    fresh = kv_cache.new_cache(model)
    model(input_ids=torch.tensor([prompt[:-1] + [tree.tokens[i] for i in path]]), cache=fresh,
          use_cache=True)
    for (k, v), (k_ref, v_ref) in zip(layer_kv(cache), layer_kv(fresh)):
        assert k.shape == k_ref.shape
        torch.testing.assert_close(k, k_ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v, v_ref, atol=1e-5, rtol=1e-4)
