"""The fused paths: the static path whose tree forward runs a decoder step with concatenated projections.

A stock transformers Llama-family layer launches three matmuls for q, k and v and two for the MLP's gate and up
projections, each behind a module call; ``FusedDecoder`` builds, once, one (q + k + v) weight and one (gate + up)
weight per layer from the model's own weights (copies: the model is left as it is) and runs the layer as few
operations: an RMS norm (``torch.nn.functional.rms_norm``), one matmul for q, k and v, one rotation of q and k
together (transformers' rotary embedding's cos and sin, computed once a forward), the keys and values written into
transformers' ``StaticCache`` at slots computed once a forward, one SDPA over the cache with the tree attention mask,
the output projection, a second RMS norm, one matmul for gate and up, SiLU times up, the down projection.  The
prefill stays transformers' own forward (``StaticForward.prefill``); both write the same cache.

* ``"fused"``: ``StaticPath`` with the fused step (any device; on a CPU it drops the per-module overhead a small
  model's forward is made of).
* ``"graphed-fused"``: ``GraphedPath`` with the fused step captured in each bucket's CUDA graph (fewer kernels a
  replay: issue 72's question, answered by ``scripts/gpu_check.py``).
* ``"graphed-fused-compiled"``: the same with ``torch.compile`` (inductor) over the fused step inside each graph, so
  what the step leaves unfused (the norms' casts and scale, the rotation, SiLU times up, the residual adds) becomes a
  few generated kernels; it compiles in ``prepare``, minutes a bucket, so ``auto`` measures it only where asked.

Which models: ``fused_problem`` accepts a decoder whose layers hold exactly the stock Llama parts (q/k/v/o
projections; gate/up/down projections and an activation; two RMS norms): Llama, SmolLM2, Mistral, Qwen2 (its q/k/v
biases concatenated too); anything else (Qwen3's q/k norms, Gemma's extra norms) says why and runs on another path.
A layout that matches but computes otherwise (Gemma 1 scales its embeddings and its norms' weights) is caught by
``FusedDecoder``'s first forward, checked against the model's own (``agreement_problem``).

Sources: gpt-fast (a static KV cache and a decode step written as the arithmetic it is, with fused QKV weights);
vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` (the concatenated projections); transformers'
``LlamaDecoderLayer`` (the computation reproduced, its rotary embedding module reused).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own name for it

from .graphs import GraphedCompiledPath, GraphedPath
from .seam import BUCKETS
from .static import StaticPath, initialised_cache, static_problem

#: The parts a fusable layer holds, by where they sit (names as transformers' Llama, Mistral and Qwen2 give them).
LAYER_PARTS = frozenset({"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"})
ATTENTION_PARTS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
MLP_PARTS = frozenset({"gate_proj", "up_proj", "down_proj", "act_fn"})
MODEL_PARTS = frozenset({"embed_tokens", "layers", "norm", "rotary_emb"})


def fused_problem(model) -> str | None:
    """Why ``FusedDecoder`` cannot run ``model`` (one sentence), or None.

    The static path must serve it (``static_problem``), and its decoder must be the stock Llama layout: the parts
    named in ``LAYER_PARTS``, ``ATTENTION_PARTS``, ``MLP_PARTS`` and ``MODEL_PARTS``, nothing more, plain
    ``nn.Linear`` projections (a bf16 model on a CPU runs oneDNN's packed linears, already its fastest kernels, and a
    q4 model 4-bit ones: neither is fused), no bias but on q, k and v, RMS norms with an ``eps``.
    """
    problem = static_problem(model)
    if problem:
        return problem
    base = getattr(model, "model", None)
    if base is None or getattr(model, "lm_head", None) is None:
        return "it is not a causal LM with a decoder and an output head"
    parts = {name for name, _ in base.named_children()}
    if parts != MODEL_PARTS:
        return f"its decoder holds {sorted(parts ^ MODEL_PARTS)} beyond or instead of Llama's parts"
    for layer in base.layers:
        for holder, want in ((layer, LAYER_PARTS), (layer.self_attn, ATTENTION_PARTS), (layer.mlp, MLP_PARTS)):
            got = {name for name, _ in holder.named_children()}
            if got != want:
                return f"its layers hold {sorted(got ^ want)} beyond or instead of Llama's parts"
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not all(type(p) is nn.Linear for p in projections):
            return "its projections are not plain linear layers (packed or quantized kernels serve them already)"
        if len({p.bias is None for p in (attn.q_proj, attn.k_proj, attn.v_proj)}) > 1:
            return "its q, k and v projections do not all carry a bias, or all none"
        if attn.o_proj.bias is not None or any(p.bias is not None for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
            return "its output or MLP projections carry a bias"
        if any(_eps(norm) is None for norm in (layer.input_layernorm, layer.post_attention_layernorm)):
            return "its norms are not RMS norms with an eps"
    return None


def _eps(norm: nn.Module) -> float | None:
    """An RMS norm's epsilon (transformers names it ``variance_epsilon``, sometimes ``eps``), None when it has none."""
    return getattr(norm, "variance_epsilon", getattr(norm, "eps", None))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMS norm as one fused op: normalised in float32, cast back, then scaled.
    x: (..., d) any float dtype; returns x's shape and dtype."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class DecoderOutput(NamedTuple):
    """What the static paths read of a step's result: ``logits`` (1, rows, |V|), the model's dtype."""

    logits: torch.Tensor


class FusedLayer(nn.Module):
    """One Llama decoder layer with its q, k and v projections concatenated, and its gate and up projections.

    Args:
        layer: transformers' decoder layer (``fused_problem`` accepted its model); its weights are copied once.
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.index = attn.layer_idx
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
        self.split = (q.out_features, k.out_features, v.out_features)  # (heads·d, kv heads·d, kv heads·d)
        self.gqa = q.out_features != k.out_features  # fewer kv heads than query heads
        self.qkv = nn.Parameter(torch.cat([q.weight, k.weight, v.weight]).detach(), requires_grad=False)
        biases = (q.bias, k.bias, v.bias)
        self.qkv_bias = None if q.bias is None else nn.Parameter(torch.cat(biases).detach(), requires_grad=False)
        self.o = attn.o_proj.weight  # (hidden, heads·d), shared with the model
        self.gate_up = nn.Parameter(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                                    requires_grad=False)  # (2·intermediate, hidden)
        self.down = mlp.down_proj.weight  # (hidden, intermediate), shared
        self.act = mlp.act_fn
        self.norm1, self.eps1 = layer.input_layernorm.weight, _eps(layer.input_layernorm)
        self.norm2, self.eps2 = layer.post_attention_layernorm.weight, _eps(layer.post_attention_layernorm)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor,
                cache) -> torch.Tensor:
        """h: (1, rows, hidden); cos, sin: (1, rows, 1, d); mask: (1, 1, rows, capacity); slots: (rows,) int64, the
        cache slots the rows' keys and values are written to; returns (1, rows, hidden)."""
        rows = h.shape[1]
        x = _rms_norm(h, self.norm1, self.eps1)
        qk, v = F.linear(x, self.qkv, self.qkv_bias).split((self.split[0] + self.split[1], self.split[2]), dim=-1)
        qk = _rotate(qk.view(1, rows, -1, self.head_dim), cos, sin)  # (1, rows, heads + kv heads, d): q and k at once
        q, k = qk.split((self.split[0] // self.head_dim, self.split[1] // self.head_dim), dim=2)
        q = q.transpose(1, 2)  # (1, heads, rows, d)
        layer = cache.layers[self.index]
        layer.keys.index_copy_(2, slots, k.transpose(1, 2))  # (1, kv heads, capacity, d): the rows written ...
        layer.values.index_copy_(2, slots, v.view(1, rows, -1, self.head_dim).transpose(1, 2))  # ... at their slots
        att = F.scaled_dot_product_attention(q, layer.keys, layer.values, attn_mask=mask, scale=self.scaling,
                                             enable_gqa=self.gqa)  # (1, heads, rows, d)
        h = h + F.linear(att.transpose(1, 2).reshape(1, rows, -1), self.o)
        x = _rms_norm(h, self.norm2, self.eps2)
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)  # (1, rows, intermediate) each
        return h + F.linear(self.act(gate) * up, self.down)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary embedding (``apply_rotary_pos_emb``: x·cos + rotate_half(x)·sin, the same operations in
    the same dtype) on q and k together.  x: (1, rows, heads, d); cos, sin: (1, rows, 1, d)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class FusedDecoder(nn.Module):
    """A Llama-family causal LM's tree forward over a static cache, as ``FusedLayer``s (the step of the fused paths).

    Called as the static paths call the model: ``step(input_ids=(1, rows) int64, attention_mask=(1, 1, rows,
    capacity) model dtype, position_ids=(1, rows) int64, cache=StaticCache, use_cache=True)``; returns
    ``DecoderOutput`` with (1, rows, |V|) logits.  The cache must be initialised and its first layer's
    ``cumulative_length`` hold the slot the rows start at (the static paths set every layer's before each forward);
    the rows' keys and values go to that slot and on, and ``cumulative_length`` is left as it was.  The embeddings,
    the rotary embedding, the final norm and the output head are the model's own modules; the layers' projections
    are copied once (SmolLM2-135M: 0.4 GB in fp32).

    Raises:
        ValueError: ``fused_problem``'s sentence, or ``agreement_problem``'s.
    """

    def __init__(self, model) -> None:
        super().__init__()
        problem = fused_problem(model)
        if problem:
            raise ValueError(f"the fused paths cannot serve this model: {problem}")
        base = model.model
        self.embed, self.rotary, self.head = base.embed_tokens, base.rotary_emb, model.lm_head
        self.norm, self.eps = base.norm.weight, _eps(base.norm)
        self.layers = nn.ModuleList(FusedLayer(layer) for layer in base.layers)
        problem = agreement_problem(model, self)
        if problem:
            raise ValueError(f"the fused paths cannot serve this model: {problem}")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache,
                use_cache: bool = True) -> DecoderOutput:
        h = self.embed(input_ids)  # (1, rows, hidden)
        cos, sin = self.rotary(h, position_ids)  # (1, rows, d) each
        cos, sin = cos[:, :, None], sin[:, :, None]  # (1, rows, 1, d): one rotation for every head of q and k
        rows = input_ids.shape[1]
        # the slots the static paths write at: the committed length (set by them before each forward) and on
        slots = cache.layers[0].cumulative_length + torch.arange(rows, device=input_ids.device)  # (rows,)
        for layer in self.layers:
            h = layer(h, cos, sin, attention_mask, slots, cache)
        return DecoderOutput(self.head(_rms_norm(h, self.norm, self.eps)))  # (1, rows, |V|)


@torch.no_grad()
def agreement_problem(model, step: FusedDecoder, tokens: int = 4) -> str | None:
    """Why ``step`` does not compute ``model``'s logits (one sentence), or None: one causal forward of ``tokens``
    tokens by each, on a fresh static cache of their own, compared within the dtype's rounding (fp32: 1e-3 of the
    logits' scale; half precision: 5e-2).  It catches a layer laid out as Llama's that computes otherwise."""
    ids = torch.arange(1, tokens + 1, device=model.device)[None] % model.config.get_text_config().vocab_size
    pos = torch.arange(tokens, device=model.device)[None]  # (1, tokens)
    mask = torch.full((1, 1, tokens, tokens), torch.finfo(model.dtype).min, dtype=model.dtype, device=model.device)
    mask = mask.triu(1)  # (1, 1, tokens, tokens): causal
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
    want = model(**inputs, cache=initialised_cache(model, tokens), use_cache=True).logits.float()
    got = step(**inputs, cache=initialised_cache(model, tokens)).logits.float()
    scale = want.abs().max().clamp(min=1.0)
    tolerance = 1e-3 if model.dtype == torch.float32 else 5e-2
    error = float((got - want).abs().max() / scale)
    return None if error <= tolerance else f"its layers compute other logits than Llama's ({error:.2g} of their scale)"


class FusedPath(StaticPath):
    """``StaticPath`` whose trees run ``FusedDecoder`` (the prefill: the model's own forward).

    Raises:
        ValueError: ``fused_problem``'s sentence.
    """

    name = "fused"

    def __init__(self, model) -> None:
        super().__init__(model)
        self.step = FusedDecoder(model)

    @classmethod
    def problem(cls, model, gguf=None) -> str | None:
        return fused_problem(model)


class GraphedFusedPath(GraphedPath):
    """``GraphedPath`` capturing ``FusedDecoder`` in each bucket's CUDA graph.  CUDA only.

    Raises:
        ValueError: the model is not on a CUDA device, or ``fused_problem``'s sentence.
    """

    name = "graphed-fused"

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS) -> None:
        super().__init__(model, buckets)
        self.step = FusedDecoder(model)

    @classmethod
    def problem(cls, model, gguf=None) -> str | None:
        return GraphedPath.problem(model) or fused_problem(model)


class GraphedFusedCompiledPath(GraphedFusedPath):
    """``GraphedFusedPath`` capturing ``torch.compile(FusedDecoder, mode=GraphedCompiledPath.MODE)`` in each graph:
    the fused step's elementwise work fused by inductor, its matmuls and SDPA kept; compiled in ``prepare`` (minutes a
    bucket the first time; inductor's cache keeps them).  CUDA only; not for ZeroGPU, which has no ``torch.compile``.

    Raises:
        ValueError: as ``GraphedFusedPath``.
    """

    name = "graphed-fused-compiled"
    compiles = True

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS) -> None:
        super().__init__(model, buckets)
        self.step = torch.compile(self.step, mode=GraphedCompiledPath.MODE, dynamic=False)
