"""The CPU kernels precision runs on: bf16 linears packed once into oneDNN's layout (``PackedLinear``) and 4-bit
linears on the model's own group codes (``Q4Linear``), each equal to the plain layer bit for bit on probes.

Which precision a model runs in is chosen by measurement (``engine.product.models.precision``); docs/results.md,
"Precision", has the measurements.
"""
from __future__ import annotations

import os

import torch

Q4_GROUP = 32  # weights per 4-bit group along the input (GGUF Q4_1's block)
#: Set to "0" to run bf16 linears unpacked (torch's plain ``F.linear``): an escape hatch, and the A/B's baseline.
PACK_ENV = "GOOSE_LENS_PACK_LINEARS"


def cpu_runs_bf16() -> bool:
    """Whether oneDNN runs bf16 matmuls on this CPU (with bf16 instructions, or emulated on AVX-512), so bf16 and
    q4 are worth measuring against fp32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cpu_has_bf16_instructions() -> bool:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX tiles).  There oneDNN's packed bf16 weights give
    ``F.linear``'s results bit for bit at every row count; where oneDNN emulates bf16 on AVX-512, a layer that
    matched on the probes may round otherwise at other row counts (a model's AR runs on the same packed layers, so
    a run's divergences from AR stay precision ties)."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(torch.nn.Module):
    """A bias-optional ``nn.Linear`` whose bf16 weight is reordered once into oneDNN's blocked layout, as
    torch inductor's weight freezing does for CPU linears, instead of on every call.

    ``forward(x)``: x (..., in_features) bf16 -> (..., out_features) bf16, equal to ``F.linear``'s bit for
    bit on the probes ``pack_linears`` checks.  The packed weight is an opaque oneDNN tensor: a packed model
    can neither be deep-copied nor moved to another device or dtype (load another copy instead).  ``weight``
    stays only when another module shares it (a tied lm_head: the embedding holds it anyway); elsewhere the
    plain weight is dropped, so the layer costs no more memory than before.
    """

    kernel = "packed"  # read by ``engine.product.models.cost_cache.curve_key``: a packed model's cost curve is its own

    def __init__(self, linear: torch.nn.Linear, keep_weight: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias
        if keep_weight:
            self.weight = linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Q4Linear(torch.nn.Module):
    """A bias-free ``nn.Linear`` whose weights are exactly 4-bit group codes, served by torch's 4-bit CPU kernel.

    SmolLM2 ships as a GGUF file in Q4_1: every group of ``Q4_GROUP`` weights along the input is d·q + m with
    q in 0..15 (llama.cpp's format; its quantizer maps a group's minimum to q = 0 and its maximum to q = 15).
    ``from_linear`` recovers (q, d, m) from the dequantized fp32 weight and refuses a layer it cannot recover
    exactly, so nothing is re-quantized: the kernel reads the model's own 4-bit codes, a quarter of bf16's bytes,
    which is what an AR step on a CPU waits for.  Activations and the per-group scale d and offset m + 8d are bf16
    (the kernel's format), so this precision rounds like bf16; it is not fp32's exact mode.  The layer runs on a
    CPU in bf16 only: a q4 model is not moved to another device or dtype (load another copy instead).

    ``forward(x)``: x (..., in_features) bf16 -> (..., out_features) bf16.
    """

    kernel = "q4"  # read by ``engine.product.models.cost_cache.curve_key``: a 4-bit model's cost curve is its own

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> None:
        """codes (N, K) int32 in 0..15; scale, low (N, K / Q4_GROUP) fp32: weight = scale · codes + low per group."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))  # (N, K/2) u8
        # the kernel computes (q - 8) · scale + zero, so zero = low + 8 · scale; (K / G, N, 2) bf16
        self.register_buffer("scale_zero", torch.stack([scale.T, (low + 8 * scale).T], -1).to(torch.bfloat16))

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: torch.nn.Linear) -> Q4Linear | None:
        """The layer in 4 bits, or None: a bias, shapes the kernel cannot take (out % 16, in % 32), or a weight
        that is not exactly 4-bit group codes."""
        w = linear.weight.detach().float()  # (N, K)
        n, k = w.shape
        if linear.bias is not None or n % 16 or k % Q4_GROUP or w.device.type != "cpu":
            return None
        groups = w.reshape(n, k // Q4_GROUP, Q4_GROUP)  # (N, K/G, G)
        low, high = groups.amin(-1), groups.amax(-1)  # (N, K/G)
        scale = (high - low) / 15
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)
        codes = torch.round((groups - low[..., None]) / safe[..., None]).clamp(0, 15)  # (N, K/G, G)
        if not torch.equal(codes * scale[..., None] + low[..., None], groups):
            return None
        return cls(codes.to(torch.int32).reshape(n, k), scale, low)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (M, K) bf16
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, Q4_GROUP, self.scale_zero)  # (M, N)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={Q4_GROUP}"


def _shared_params(model) -> set[int]:
    """ids of the parameters held by modules other than plain ``nn.Linear``s (a tied lm_head's weight: the
    embedding's), which a swapped layer must keep reachable."""
    return {id(p) for m in model.modules() if type(m) is not torch.nn.Linear for p in m.parameters(recurse=False)}


@torch.no_grad()
def quantize_linears(model) -> int:
    """Swap each fp32 ``nn.Linear`` of a CPU ``model`` whose weight is exactly 4-bit group codes for a ``Q4Linear``,
    in place (a tied lm_head too: the embedding keeps its own weight); returns how many (0: nothing changed, the
    model is not 4-bit).  Call it on the fp32 model, before ``.to(torch.bfloat16)``."""
    others = _shared_params(model)
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32:
                q4 = Q4Linear.from_linear(child)
                if q4 is not None:
                    if id(child.weight) in others:  # tied: code that reads the head's weight still finds it
                        q4.weight = child.weight
                    setattr(parent, name, q4)
                    swapped += 1
    return swapped


def packing_enabled() -> bool:
    """Whether bf16 linears get packed here: a CPU where oneDNN runs bf16, ``$GOOSE_LENS_PACK_LINEARS`` not "0"."""
    return cpu_runs_bf16() and os.environ.get(PACK_ENV) != "0"


@torch.no_grad()
def pack_linears(model) -> int:
    """Swap each bf16 ``nn.Linear`` of a CPU ``model`` (lm_head included) for a ``PackedLinear``, in place.

    Only where ``packing_enabled()``, and only layers whose packed output equals ``F.linear``'s bit for bit
    on probes of 1, 3 and 16 rows (a layer that fails the check or raises stays as it was).  Then one
    forward of the whole model: a model whose code reads a packed layer's weight gets every layer back.
    Returns how many layers were packed (0: nothing changed).  Call it last: after ``.to(dtype)``,
    ``.to(device)`` and any deepcopy.
    """
    if not packing_enabled():
        return 0
    gen = torch.Generator().manual_seed(0)
    others = _shared_params(model)
    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child.weight.dtype != torch.bfloat16 \
                    or child.weight.device.type != "cpu":
                continue
            try:
                swap = PackedLinear(child, keep_weight=id(child.weight) in others)
                same = all(torch.equal(swap(x), torch.nn.functional.linear(x, child.weight, child.bias))
                           for x in (torch.randn(1, rows, child.in_features, generator=gen).to(torch.bfloat16)
                                     for rows in (1, 3, 16)))
            except (AttributeError, RuntimeError, NotImplementedError):
                continue
            if same:
                setattr(parent, name, swap)
                swapped.append((parent, name, child))
    if swapped:
        try:
            model(input_ids=torch.tensor([[0, 1, 2]], device=model.device))
        except Exception:  # noqa: BLE001 - any failure: the model's own code needs plain layers
            for parent, name, child in swapped:
                setattr(parent, name, child)
            return 0
    return len(swapped)
