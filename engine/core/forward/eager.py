"""The reference path ("eager"): transformers' ``DynamicCache`` (``engine.core.kv_cache``), each tree forwarded at its
own size; the fallback wherever another path cannot serve.

Source: transformers' ``DynamicCache``; tree attention as in SpecInfer / Medusa (``engine.core.verify.forward_tree``).
"""
from __future__ import annotations

import torch

from .. import kv_cache
from ..tree import DraftTree
from ..verify import forward_tree
from .seam import ForwardPath, TreeForward


class EagerForward(TreeForward):
    """``TreeForward`` over transformers' ``DynamicCache``: each tree forwarded at its size (``kv_cache``)."""

    def __init__(self, model, max_length: int) -> None:
        self.model = model
        self.cache = kv_cache.new_cache(model, max_length)
        self.length = 0
        self._rows = 0  # rows of the last verified tree, still in the cache

    @torch.no_grad()
    def prefill(self, ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long, device=self.model.device)  # (1, L)
        logits = self.model(input_ids=x, cache=self.cache, use_cache=True).logits[0]  # (L, |V|)
        self.length = len(ids)
        return logits

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> torch.Tensor:
        if self._rows:
            self.commit([])  # an uncommitted tree: dropped
        logits = forward_tree(self.model, self.cache, tree, self.length)  # (n, |V|)
        self._rows = len(tree)
        return logits

    def commit(self, keep: list[int]) -> None:
        kv_cache.keep_path(self.cache, self.length, keep)
        self.length += len(keep)
        self._rows = 0


class EagerPath(ForwardPath):
    """The reference path: ``EagerForward`` for every generation."""

    name = "eager"

    def open(self, max_length: int, max_rows: int = 1) -> TreeForward:
        return EagerForward(self.model, max_length)
