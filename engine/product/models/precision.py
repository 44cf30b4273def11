"""Precision chosen by measurement: the dtype that verifies draft trees fastest on this device.

Speculative decoding trades one forward of n rows for several one-row forwards, so what matters is the cost of both:
T(1) (an AR step, the bonus-only cycle) and T(16) (a typical verified tree).  On CUDA half precision is the fast
path by construction (bf16 where the device supports it, else fp16).  On a CPU it depends on the machine: a CPU with
bf16 instructions (oneDNN's avx512_core_bf16 / AMX kernels) may run a tree faster in bf16 than in fp32; oneDNN
emulates bf16 on other AVX-512 CPUs, and without AVX-512 runs none (fp32 then, unmeasured).  The attention kernel
matters as much at these sizes: eager attention (plain matmuls) can beat sdpa at 1-16 rows (docs/results.md,
"Precision").  So ``dtype="auto"`` on a CPU measures fp32 and bf16, each with sdpa and eager attention, once per
(model, CPU, torch version, threads), and keeps the fastest: the lowest T(1) + T(16) (an AR step plus a tree, the
two forwards a run alternates between).  The result is cached next to the cost curves
(``$GOOSE_LENS_CACHE/precision``).

A bf16 model on such a CPU runs its linears on weights reordered once into oneDNN's blocked layout
(``pack_linears``): torch's plain bf16 ``F.linear`` reorders the weight on every call, which can make an AR step in
bf16 slower than fp32's; packed, it is not (docs/results.md, "Precision").  The outputs equal ``F.linear``'s bit for
bit (checked per layer on probes when packing; at every row count only on a CPU with bf16 instructions).

A checkpoint whose weights are 4-bit group codes (SmolLM2's GGUF file is Q4_1) is also measured as "q4": its linears
run torch's 4-bit CPU kernel on the model's own codes (``Q4Linear``), reading a quarter of bf16's bytes, with bf16
activations: on a 2-core CPU it can verify 1 to 16 rows faster than packed bf16 (docs/results.md, "Precision").

fp32 is the exact mode: greedy output equals ``generate(do_sample=False)`` token for token.  In half precision a
batched forward rounds differently from a one-token one, so a near-tie may flip (``engine.product.runs.lossless``
attributes each such divergence).
"""
from __future__ import annotations

import copy
import logging
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.core import attention
from engine.core.forward import EagerPath
from engine.product.models.kernels import Q4Linear, cpu_runs_bf16, pack_linears, packing_enabled, quantize_linears
from engine.product.models.machine import cpu_name, free_memory
from engine.product.models.timing import cache_file, read_cache, time_forwards, write_cache

log = logging.getLogger(__name__)  # start-up steps, for the console (app.py shows INFO)

#: dtype names as the CLI and the page spell them.
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: "q4": the model's 4-bit weights (``Q4Linear``) with bf16 activations, a CPU precision of 4-bit checkpoints.
Q4 = "q4"
BY_NAME = {**{name: dtype for dtype, name in NAMES.items()}, Q4: torch.bfloat16}
TREE_ROWS = 16  # the tree size the choice weighs beside one AR step (the GT-sized trees of a CPU run are 4-32)
FORMAT = 4  # version of the cached choice file (3: bf16 is measured with packed linears; 4: and q4)
#: (dtype, attention implementation) pairs a CPU measures; the first is the reference the sentence compares with.
#: q4 is measured only for a model whose weights are 4-bit codes (``apply``).
CPU_VARIANTS = (("fp32", "sdpa"), ("fp32", "eager"), ("bf16", "sdpa"), ("bf16", "eager"), (Q4, "sdpa"), (Q4, "eager"))


def dtype_name(dtype: torch.dtype) -> str:
    """'fp32' / 'fp16' / 'bf16' (else torch's own name)."""
    return NAMES.get(dtype, str(dtype).removeprefix("torch."))


def precision_name(model) -> str:
    """The precision ``model`` runs in: "q4" when 4-bit layers serve it (``Q4Linear``), else its dtype's name."""
    return Q4 if any(isinstance(m, Q4Linear) for m in model.modules()) else dtype_name(model.dtype)


@dataclass(frozen=True)
class PrecisionChoice:
    """The dtype ``auto`` resolved to, and why (shown in the page header and the CLI's JSON).

    Attributes:
        dtype: 'fp32', 'bf16', 'fp16' or 'q4' (the model's 4-bit weights, bf16 activations: ``Q4Linear``).
        reason: one sentence, e.g. "bf16: verifies 16 rows 1.6× faster than fp32 here".
        ms: measured medians {"dtype/attention": [T(1), T(16)]} in ms ({} when nothing was measured).
        attn: the attention implementation to use ('sdpa', 'eager'), or "" to keep the model's own.
    """

    dtype: str
    reason: str
    ms: dict
    attn: str = ""

    @property
    def torch_dtype(self) -> torch.dtype:
        return BY_NAME[self.dtype]


def apply(model, name: str) -> int:
    """Turn a CPU ``model`` loaded in fp32 into precision ``name`` ("fp32", "bf16" or "q4"), in place as far as
    torch allows; returns the layers given a faster kernel (bf16: packed, q4: 4-bit plus packed).

    Raises:
        ValueError: "q4" for a model with no 4-bit layer.
    """
    q4 = quantize_linears(model) if name == Q4 else 0
    if name == Q4 and not q4:
        raise ValueError("its weights are not 4-bit group codes (Q4_1, as SmolLM2's GGUF file has them)")
    model.to(BY_NAME[name])
    return q4 + (pack_linears(model) if BY_NAME[name] == torch.bfloat16 else 0)


def cuda_choice(device: str) -> PrecisionChoice:
    """CUDA: bf16 where the device supports it, else fp16 (no measurement: half precision is the fast path)."""
    if torch.cuda.is_bf16_supported():
        return PrecisionChoice("bf16", "bf16: this GPU supports it natively", {})
    return PrecisionChoice("fp16", "fp16: this GPU has no bf16", {})


@torch.no_grad()
def measure(model, variants: tuple[tuple[str, str], ...] = CPU_VARIANTS, past: int = 128,
            repeats: int = 9) -> dict[str, list[float]]:
    """Median ms of one forward of 1 and of ``TREE_ROWS`` rows over ``past`` cached tokens, per (dtype, attention).

    ``model`` (fp32) is copied once per variant and made that precision as ``load_model`` will serve it
    (``apply``: packed bf16 linears, 4-bit ones for "q4"; a variant the model cannot run is left out); sizes and
    variants are timed by the project's one timer (``timing.time_forwards``: pairs in a new order each round, the
    loop's read-back, the warm-up round dropped).
    "sdpa" is timed as ``load_model`` serves it (``attention.use_tree_sdpa``).
    Returns {"dtype/attention": [T(1), T(16)]}.
    """
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    copies = {}
    for dtype, attn in variants:
        m = copy.deepcopy(model).eval()
        try:
            m.set_attn_implementation(attn)
            attention.use_tree_sdpa(m)  # sdpa as load_model serves it
            apply(m, dtype)
        except (ValueError, ImportError, AttributeError):
            continue
        copies[f"{dtype}/{attn}"] = m
    prefix = torch.randint(0, vocab, (past,), generator=gen).tolist()
    forwards = {}
    for name, m in copies.items():
        forwards[name] = EagerPath(m).open(past + TREE_ROWS + 1, TREE_ROWS)
        forwards[name].prefill(prefix)
    return time_forwards(forwards, (1, TREE_ROWS), vocab, model.device, repeats).medians((1, TREE_ROWS))


def decide(ms: dict[str, list[float]], reference: str = "fp32/sdpa") -> PrecisionChoice:
    """The fastest variant by T(1) + T(16) of ``measure``'s medians, with the sentence that says why (compared
    with fp32 and the ``reference`` attention)."""
    best = min(ms, key=lambda v: sum(ms[v]))
    dtype, attn = best.split("/")
    ref = ms.get(reference) or ms[min((v for v in ms if v.startswith("fp32/")), key=lambda v: sum(ms[v]))]
    kernel = f" with {attn} attention" if best != reference and attn != reference.split("/")[1] else ""
    what = {"bf16": "bf16", Q4: "q4 (the model's 4-bit weights, bf16 activations)"}.get(dtype)
    if what:
        return PrecisionChoice(dtype, f"{what}{kernel}: verifies {TREE_ROWS} rows {ref[1] / ms[best][1]:.1f}× faster "
                                      f"than fp32 here (an AR step {ref[0] / ms[best][0]:.1f}×)", ms, attn)
    bf16 = min((ms[v] for v in ms if v.startswith("bf16/")), key=sum, default=None)
    than = f" ({TREE_ROWS} rows {bf16[1] / ms[best][1]:.1f}× this time)" if bf16 else ""
    return PrecisionChoice("fp32", f"fp32{kernel}: bf16 is no faster on this CPU{than}", ms, attn)


def _cache_file(key: str, cache_dir: str | Path | None) -> Path:
    return cache_file("precision", key, cache_dir)


def machine_key(model_name: str) -> str:
    """What a CPU choice depends on: the model, the CPU, torch, its thread count and whether bf16 linears are
    packed (never a path)."""
    threads = torch.get_num_threads()
    packed = "packed" if packing_enabled() else "plain"  # bf16 is measured as it will run
    return f"{model_name}|{platform.machine()}|{cpu_name()}|torch {torch.__version__}|{threads} threads|{packed}"


def cached_choice(model_name: str, cache_dir: str | Path | None = None) -> PrecisionChoice | None:
    """The CPU precision for ``model_name`` without measuring: fp32 where oneDNN runs no bf16 here, else the
    cached choice of this machine (``machine_key``), else None (``cpu_choice`` would measure)."""
    if not cpu_runs_bf16():
        return PrecisionChoice("fp32", "fp32: this CPU runs no bf16", {})
    key = machine_key(model_name)
    data = read_cache(_cache_file(key, cache_dir), format=FORMAT, key=key)
    try:
        return PrecisionChoice(data["dtype"], data["reason"], data["ms"], data.get("attn", "")) if data else None
    except (KeyError, TypeError):
        return None


def cpu_choice(model, model_name: str, cache_dir: str | Path | None = None) -> PrecisionChoice:
    """The CPU precision for ``model`` (loaded in fp32): cached, else measured (a few seconds) and cached.

    fp32 without measuring where oneDNN runs no bf16 here.  A cache folder that is not writable only
    costs a re-measurement next time.
    """
    known = cached_choice(model_name, cache_dir)
    if known is not None:
        return known
    key = machine_key(model_name)
    path = _cache_file(key, cache_dir)
    need = 4 * sum(p.numel() for p in model.parameters()) * 4  # the copies measure() holds at once (bytes)
    free = free_memory("cpu")
    if free is not None and need > 0.7 * free:
        return PrecisionChoice("fp32", "fp32: too little free memory to measure bf16 beside it", {})
    log.info("auto precision: timing fp32, bf16 and q4 forwards here (once per machine and model, ~15 s on 2 cores)")
    start = time.perf_counter()
    choice = decide(measure(model))
    log.info("auto precision: %s (measured in %.0f s)", choice.reason, time.perf_counter() - start)
    write_cache(path, {"format": FORMAT, "key": key, **asdict(choice)})
    return choice
