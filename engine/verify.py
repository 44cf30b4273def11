"""Tree verification: one forward of the stock HF model, then the greedy walk with source priority.

Source: Goose paper, Algorithm 3 (UNIFIEDGREEDYWALK) and Appendix B.3; tree attention as in
SpecInfer (Miao et al., 2024) / Medusa (Cai et al., 2024).
"""
from __future__ import annotations

import torch

from .tree import WALK_PRIORITY, DraftTree


@torch.no_grad()
def forward_tree(model, cache, tree: DraftTree, past_len: int) -> torch.Tensor:
    """Score every node of ``tree`` in one forward; the cache grows by ``len(tree)`` rows.

    Args:
        model: a transformers causal LM.
        cache: its ``DynamicCache`` holding ``past_len`` committed positions.
        tree: n nodes; node 0 is the anchor (not yet in the cache).
        past_len: committed cache length.

    Returns:
        (n, |V|) logits, the model's dtype, on the model's (first) device; row i predicts the token after node i.
    """
    device = model.device
    out = model(
        input_ids=tree.input_ids(device),  # (1, n)
        attention_mask=tree.attention_mask(past_len, model.dtype, device),  # (1, 1, n, past + n)
        position_ids=tree.position_ids(past_len, device),  # (1, n)
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[0]  # (n, |V|)


def greedy_walk(tree: DraftTree, greedy: list[int]) -> tuple[tuple[int, ...], int]:
    """Goose Algorithm 3: the longest path whose every token equals the target's greedy choice.

    At each node, children are tried in source priority (PLD spine before TR branch), then in
    insertion order; the first child whose token equals ``greedy[node]`` is accepted.

    Args:
        tree: the verified draft tree.
        greedy: (n,) argmax token of each node's logit row.

    Returns:
        (accepted node indices from the root's child down, root excluded; bonus token id), where the
        bonus token is the target's greedy token at the last accepted node.
    """
    node, accepted = 0, []
    while True:
        want = greedy[node]
        kids = sorted(tree.children[node], key=lambda c: WALK_PRIORITY.index(tree.sources[c]))
        nxt = next((c for c in kids if tree.tokens[c] == want), None)
        if nxt is None:
            return tuple(accepted), want
        accepted.append(nxt)
        node = nxt
