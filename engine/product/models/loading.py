"""Model loading: named models, hub ids, local folders and ``.gguf`` files; device, dtype, accelerate.

What ``--model`` accepts (``resolve`` decides which):

- ``smollm2`` / ``smollm2-135m-instruct``: SmolLM2-135M-Instruct from a PyPI wheel, converted once
  (``engine/product/models/named.py``); the default of the page, the CLI and the benchmark;
- ``demo``: the 5.5M-parameter model embedded in ``assets/demo-model`` (fully offline);
- a local ``.gguf`` file (dequantized by transformers, the same path the named model is converted by);
- a local folder or a hub id (``from_pretrained``).

A loaded model is named by an id (``LoadedModel.name``) that never contains a machine path: the named
model's name, the hub id, or the file / folder name of a local model.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.core import attention, compat
from engine.core.forward import llamacpp, runs_file
from engine.product.models import forward_choice, kernels, precision
from engine.product.models.engine_thread import EngineThread
from engine.product.models.loaded import LoadedModel
from engine.product.models.model_source import DTYPES, ModelLoadError, ModelSource, check_source, resolve
from engine.product.models.named import FetchError, Progress, ensure_model, load_gguf
from engine.product.models.what_runs import allows_file_paths


def resolve_device(device: str) -> str:
    """The device a load asks for: 'auto' is 'cuda' where a CUDA device is present, else 'cpu'; any other name as given.

    Raises:
        ModelLoadError: 'cuda' or 'cuda:N' asked for on a machine without a CUDA device (one line, with the remedy).
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA device is available; use --device cpu")
    return device


def resolve_dtype(dtype: str, device: str) -> tuple[str | None, str]:
    """The precision ``dtype`` asks for on ``device`` (a ``DTYPES`` name), and a sentence when it had to fall back.

    Returns:
        (name, note): name None = "auto" on a CPU, decided by measurement once the model is loaded
        (``precision.cpu_choice``); note "" unless an unsupported request fell back (fp16 on a CPU ->
        auto; bf16 on a GPU without it -> fp16; q4 on a GPU -> the GPU's half precision).

    Raises:
        ModelLoadError: an unknown dtype name.
    """
    if dtype not in ("auto", *DTYPES):
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}")
    cuda = device.startswith("cuda")
    if dtype == "fp16" and not cuda:
        return None, "fp16 is not supported on a CPU (no fast kernels); using the measured precision instead."
    if dtype == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        return "fp16", "bf16 is not supported on this GPU; using fp16 instead."
    if dtype == precision.Q4 and cuda:
        choice = precision.cuda_choice(device)
        return choice.dtype, f"q4 runs on a CPU only (torch's 4-bit CPU kernel); using {choice.dtype} instead."
    if dtype == "auto":
        return (precision.cuda_choice(device).dtype if cuda else None), ""
    return dtype, ""


def load_model(name_or_path: str | None = None, device: str = "auto", dtype: str = "auto",
               attn_implementation: str | None = None, progress: Progress | None = None,
               engine: EngineThread | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: ``smollm2``, ``demo``, a local ``.gguf`` file, a local folder or a hub id; None =
            ``$GOOSE_LENS_MODEL`` if set, else SmolLM2 (fetched and converted on first use, ~1 min).
        device: 'auto' (CUDA if present, and accelerate's device_map='auto' over several GPUs), 'cpu', 'cuda', 'cuda:N'.
        dtype: 'auto' (bf16/fp16 on CUDA; on a CPU fp32, bf16 or, for a 4-bit checkpoint, q4, whichever verifies
            trees faster here, measured once and cached: ``engine.product.models.precision``), 'fp32' (exact),
            'fp16', 'bf16', 'q4' (a CPU and a 4-bit checkpoint: its own 4-bit weights, bf16 activations); an
            unsupported one falls back with a note in ``LoadedModel.dtype_reason``.
        attn_implementation: None (transformers' default, sdpa: served as ``tree_sdpa`` where the model groups
            query heads, ``engine/core/attention.py``), 'eager', 'sdpa' (transformers' own) or 'tree_sdpa'.
        progress: called with (fraction, message) while a named model is fetched and converted.
        engine: the thread that times forwards (the auto precision's measurement), e.g. the page's engine thread
            (``engine_thread.py``: forwards timed elsewhere can read twice as slow); None: the calling thread.

    Raises:
        ModelLoadError: the model cannot be had or loaded (missing, offline, checksum, not a causal LM,
            bad device/dtype), or tree verification cannot serve it (``compat.model_problem``: its attention
            kernel, ALiBi positions, recurrent layers); the message is one line naming the model and the cause.
    """
    src = resolve(name_or_path)
    local = check_source(src)  # before the device, dtype and any hub traffic: what cannot load says so at once
    dev = resolve_device(device)
    want, note = resolve_dtype(dtype, dev)
    # a CPU's "auto" loads fp32, then measures; q4 loads fp32, then finds the 4-bit codes in the weights
    torch_dtype = precision.BY_NAME[want] if want and want != precision.Q4 else torch.float32
    multi_gpu = device == "auto" and torch.cuda.device_count() > 1
    model, tokenizer = _load_weights(src, local, torch_dtype, attn_implementation, multi_gpu, progress)
    problem = compat.model_problem(model)  # before any forward (the precision measurement's too)
    if problem:
        raise ModelLoadError(f"could not use model {src.name!r}: {problem}")
    if not multi_gpu:
        model = model.to(dev)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    asked = _DtypeAsked(dtype, want, note, torch_dtype)
    torch_dtype, reason, auto = (engine.call if engine else _call)(_set_precision, model, src.name, dev, asked,
                                                                   attn_implementation)
    if not attn_implementation:  # sdpa verifies trees without copying the KV cache per head (core/attention.py)
        attention.use_tree_sdpa(model)
    return LoadedModel(model, tokenizer, src.name, "auto (device_map)" if multi_gpu else dev, torch_dtype, src.title,
                       reason, auto, params, source=src)


def with_forward(lm: LoadedModel, want: str | None = None, engine: EngineThread | None = None) -> LoadedModel:
    """``lm`` with its trees run on the forward path ``want`` (``forward_choice.choose``: "auto" or a registered path;
    None reads ``$GOOSE_LENS_FORWARD``, else "auto": the fastest path measured once per model and machine, llamacpp
    among them for a model from a ``.gguf`` file), chosen (and compiled) on ``engine`` when given."""
    want, gguf = forward_wanted(lm, want)
    choice = (engine.call if engine else _call)(forward_choice.choose, lm.model, want, gguf=gguf)
    return replace(lm, forward_path=choice.path, forward_reason=choice.reason)


def forward_wanted(lm: LoadedModel, want: str | None = None) -> tuple[str, Path | None]:
    """What ``forward_choice.choose`` is asked for ``lm``: the path ``want`` (None: ``$GOOSE_LENS_FORWARD``, else
    "auto"), and the model's ``.gguf`` file where that may pick a llamacpp path (llama-cpp-python installed, and the
    precision chosen by "auto": ``what_runs.allows_file_paths``), else None; the file is fetched only then.

    Raises:
        ModelLoadError: a llamacpp path asked by name for a model whose precision was named ("fp32"): that path would
            run the file's own weights, not the precision asked.
    """
    want = want or os.environ.get(forward_choice.ENV) or "auto"
    file_path = runs_file(want)
    if file_path and not allows_file_paths(lm.auto_dtype):
        raise ModelLoadError(f"the {want} forward path runs the model file's own weights on llama.cpp's kernels, "
                             f"not {lm.precision} as the dtype asked: ask dtype auto with it, or another path")
    reads_file = file_path or (want == "auto" and allows_file_paths(lm.auto_dtype))
    return want, lm.gguf() if reads_file and llamacpp.installed() else None


def dtype_beside(forward: str | None, otherwise: str) -> str:
    """The dtype a command asks by default beside the forward path it names: "auto" where ``forward`` is a path that
    runs the model file's own weights (only "auto" may be served by one: ``what_runs.allows_file_paths``), else
    ``otherwise`` (e.g. a script's "fp32", whose text every method shares)."""
    return "auto" if runs_file(forward) else otherwise


def _load_weights(src: ModelSource, local: bool, torch_dtype: torch.dtype, attn_implementation: str | None,
                  multi_gpu: bool, progress: Progress | None) -> tuple:
    """``load_model``'s (model, tokenizer), fetched (a named model) and read from a folder or a ``.gguf`` file.

    Raises:
        ModelLoadError: the fetch or the load failed; one line naming the model and the cause.
    """
    kwargs = {"dtype": torch_dtype, "local_files_only": local}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if multi_gpu:
        kwargs["device_map"] = "auto"
    try:
        path = str(ensure_model(src.fetch, progress or (lambda f, m: None))) if src.fetch else src.path
        if path.endswith(".gguf"):
            model, tokenizer = load_gguf(Path(path), torch_dtype)
            if attn_implementation:
                model.set_attn_implementation(attn_implementation)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except FetchError as exc:
        raise ModelLoadError(f"could not get model {src.name!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - any failure becomes one clear message naming the model
        reason = str(exc).strip().splitlines()[0].rstrip(" :.") if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"could not load model {src.name!r}: {reason}") from exc
    return model, tokenizer


def _call(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` here (``load_model`` without an engine thread)."""
    return fn(*args, **kwargs)


class _DtypeAsked(NamedTuple):
    """The ``dtype`` asked of ``load_model``, what ``resolve_dtype`` made of it (``want``, ``note``) and the
    torch dtype the weights were loaded in."""

    dtype: str
    want: str | None
    note: str
    torch_dtype: torch.dtype


def _set_precision(model, name: str, dev: str, asked: _DtypeAsked,
                   attn_implementation: str | None) -> tuple[torch.dtype, str, bool]:
    """Put the loaded ``model`` in its precision (q4's kernel; a CPU's auto measured; bf16's packed linears);
    returns (torch dtype, the reason for the choice, whether it was automatic)."""
    dtype, want, note, torch_dtype = asked
    if want == precision.Q4:
        try:
            precision.apply(model, want)  # the 4-bit kernel on the model's own codes, other linears packed
            torch_dtype = precision.BY_NAME[want]
        except ValueError as exc:
            note, want = f"q4 is not possible for this model: {exc}; using the measured precision instead.", None
    reason, auto = note, dtype == "auto" or want is None
    if want is None:  # a CPU's auto: the fastest of fp32, bf16 and (a 4-bit checkpoint) q4, measured here
        choice = precision.cpu_choice(model, name)
        torch_dtype, reason = choice.torch_dtype, " ".join(filter(None, (note, choice.reason)))
        if choice.attn and not attn_implementation:  # the measured kernel, unless the caller named one
            model.set_attn_implementation(choice.attn)
        precision.apply(model, choice.dtype)  # bf16: linears packed (precision.py's docstring); q4: 4-bit
    elif dtype == "auto":
        reason = precision.cuda_choice(dev).reason
    elif dev == "cpu" and want == "bf16":
        kernels.pack_linears(model)  # bf16 linears on weights reordered once (kernels.py)
    return torch_dtype, reason, auto


def tqdm_progress(desc: str = "model"):
    """A ``Progress`` callback drawing a tqdm bar (percent) on stderr, for the command line."""
    from tqdm import tqdm

    bar = None

    def update(fraction: float, message: str) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=100, desc=desc, unit="%", bar_format="{desc}: {percentage:3.0f}% |{bar}| {postfix}")
        bar.update(round(fraction * 100) - bar.n)
        bar.set_postfix_str(message)
        if fraction >= 1.0:
            bar.close()

    return update
