"""Precision chosen by measurement: the dtype that verifies draft trees fastest on this device.

Speculative decoding trades one forward of n rows for several one-row forwards, so what matters is the
cost of both: T(1) (an AR step, the bonus-only cycle) and T(16) (a typical verified tree).  On CUDA
half precision is the fast path by construction (bf16 where the device supports it, else fp16).  On a
CPU it depends on the machine: a CPU with native bf16 (oneDNN's avx512_core_bf16 / AMX kernels) may run a
16-row forward of SmolLM2 1.6x faster in bf16 than in fp32, a CPU without it emulates bf16 and runs it
slower.  So ``dtype="auto"`` on a CPU measures both, once per (model, CPU, torch version, threads), and
keeps the faster: the one with the lower T(1) + T(16) (an AR step plus a tree, the two forwards a run
alternates between).  The result is cached next to the cost curves (``$GOOSE_LENS_CACHE/precision``).

fp32 is the exact mode: greedy output equals ``generate(do_sample=False)`` token for token.  In half
precision a batched forward rounds differently from a one-token one, so a near-tie may flip
(``engine.lossless`` attributes each such divergence).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import kv_cache

#: dtype names as the CLI and the page spell them.
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
TREE_ROWS = 16  # the tree size the choice weighs beside one AR step (the GT-sized trees of a CPU run are 4-32)
FORMAT = 1  # version of the cached choice file


def dtype_name(dtype: torch.dtype) -> str:
    """'fp32' / 'fp16' / 'bf16' (else torch's own name)."""
    return NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class PrecisionChoice:
    """The dtype ``auto`` resolved to, and why (shown in the page header and the CLI's JSON).

    Attributes:
        dtype: 'fp32', 'bf16' or 'fp16'.
        reason: one sentence, e.g. "bf16: verifies 16 rows 1.6× faster than fp32 here".
        ms: measured medians {dtype name: [T(1), T(16)]} in ms ({} when nothing was measured).
    """

    dtype: str
    reason: str
    ms: dict

    @property
    def torch_dtype(self) -> torch.dtype:
        return {v: k for k, v in NAMES.items()}[self.dtype]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (oneDNN's avx512_core_bf16 or AMX), not by emulation."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cuda_choice(device: str) -> PrecisionChoice:
    """CUDA: bf16 where the device supports it, else fp16 (no measurement: half precision is the fast path)."""
    if torch.cuda.is_bf16_supported():
        return PrecisionChoice("bf16", "bf16: this GPU supports it natively", {})
    return PrecisionChoice("fp16", "fp16: this GPU has no bf16", {})


@torch.no_grad()
def measure(model, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16), past: int = 128,
            repeats: int = 9) -> dict[str, list[float]]:
    """Median ms of one forward of 1 and of ``TREE_ROWS`` rows over ``past`` cached tokens, per dtype.

    ``model`` (any dtype) is copied once per dtype; sizes and dtypes are interleaved within each repeat so
    machine drift hits all alike; the first repeat warms up.  Returns {dtype name: [T(1), T(16)]}.
    """
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    copies = {d: (model if model.dtype == d else copy.deepcopy(model).to(d)).eval() for d in dtypes}
    prefix = torch.randint(0, vocab, (1, past), generator=gen).to(model.device)
    caches = {}
    for d, m in copies.items():
        caches[d] = kv_cache.new_cache(m, past + TREE_ROWS + 1)
        m(input_ids=prefix, past_key_values=caches[d], use_cache=True)
    times: dict[tuple[torch.dtype, int], list[float]] = {(d, n): [] for d in dtypes for n in (1, TREE_ROWS)}
    for _ in range(repeats + 1):
        for (d, n), row in times.items():
            ids = torch.randint(0, vocab, (1, n), generator=gen).to(model.device)
            t0 = time.perf_counter()
            copies[d](input_ids=ids, past_key_values=caches[d], use_cache=True).logits[0, :, :].argmax(-1).tolist()
            row.append((time.perf_counter() - t0) * 1000)
            caches[d].crop(-n)
    return {dtype_name(d): [round(statistics.median(times[(d, n)][1:]), 3) for n in (1, TREE_ROWS)] for d in dtypes}


def decide(ms: dict[str, list[float]]) -> PrecisionChoice:
    """The faster of fp32 and bf16 by T(1) + T(16) from ``measure``'s medians, with the sentence that says why."""
    fp32, bf16 = ms["fp32"], ms["bf16"]
    tree = fp32[1] / bf16[1]
    if sum(bf16) < sum(fp32):
        return PrecisionChoice("bf16", f"bf16: verifies {TREE_ROWS} rows {tree:.1f}× faster than fp32 here "
                                       f"(an AR step {fp32[0] / bf16[0]:.1f}×)", ms)
    return PrecisionChoice("fp32", f"fp32: bf16 is no faster on this CPU ({TREE_ROWS} rows {1 / tree:.1f}× "
                                   f"fp32's time)", ms)


def _cache_file(key: str, cache_dir: str | Path | None) -> Path:
    folder = Path(cache_dir or os.environ.get("GOOSE_LENS_CACHE") or Path.home() / ".cache" / "goose-lens")
    return folder / "precision" / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")


def machine_key(model_name: str) -> str:
    """What a CPU choice depends on: the model, the CPU, torch and its thread count (never a path)."""
    threads = torch.get_num_threads()
    return f"{model_name}|{platform.machine()}|{_cpu_name()}|torch {torch.__version__}|{threads} threads"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def cpu_choice(model, model_name: str, cache_dir: str | Path | None = None) -> PrecisionChoice:
    """The CPU precision for ``model`` (loaded in fp32): cached, else measured (a few seconds) and cached.

    fp32 without measuring where the CPU has no native bf16.  A cache folder that is not writable only
    costs a re-measurement next time.
    """
    if not cpu_has_native_bf16():
        return PrecisionChoice("fp32", "fp32: this CPU has no native bf16", {})
    key = machine_key(model_name)
    path = _cache_file(key, cache_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") == FORMAT and data.get("key") == key:
            return PrecisionChoice(data["dtype"], data["reason"], data["ms"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    choice = decide(measure(model))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "key": key, **asdict(choice)}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
    return choice
